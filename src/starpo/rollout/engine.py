"""The multi-turn rollout engine: env groups x group size, one batched generation per turn.

Token-in, token-out: each trajectory's `token_ids` are exactly the fed-in chunks plus the
generated tokens, never a re-tokenisation of decoded text, and the backend keeps every
episode's KV cache, so a turn only encodes the new observation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from starpo.config.episode import EpisodeSettings
from starpo.envs import TextEnv, make
from starpo.envs.base import state_digest
from starpo.envs.start_states import start_options
from starpo.envs.tools import is_tool_env
from starpo.errors import UserError
from starpo.rollout import prompts
from starpo.rollout.backends.base import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from starpo.rollout.chat import ChatTokens
from starpo.rollout.parser import TAGGED, parse_tool_turn, parse_turn
from starpo.types import Trajectory, Turn

ANSWER_CLOSE_VARIANTS = ("</answer>", " </answer>")
#: Where a tool-calling turn of one call ends (`stop_at_answer`, `max_actions_per_turn=1`).
TOOL_CALL_CLOSE_VARIANTS = ("</tool_call>",)


class EpisodePlayer(Protocol):
    """What the trainer and `play_seeds` call to play episodes with fixed settings:
    `RolloutEngine` in-process, `starpo.distributed.PoolEngine` over Ray workers."""

    generation_seconds: float  # time spent generating, summed over runs

    def run(
        self,
        env_id: str,
        seeds: list[int],
        group_size: int,
        *,
        env_kwargs: dict[str, Any] | None = None,
        on_turn: Callable[[int], None] | None = None,
        starts: list[Any] | None = None,
    ) -> list[Trajectory]:
        """Play `group_size` episodes from each seed (one env group per seed), in group
        order; `on_turn(turn)` after each turn (or once, where turns run elsewhere);
        `starts`: per seed, a start state to begin from (the env's reset option "start";
        None: the seed's own start)."""
        ...


class EnvFault(Exception):
    """An env raised or hung; the message says where and what."""


def _attempt(call: Callable[[], Any]) -> dict[str, Any]:
    """{"value": call()}, or {"error": the exception it raised}."""
    try:
        return {"value": call()}
    except Exception as exc:  # noqa: BLE001 - a plugin env's bug becomes an errored episode
        return {"error": exc}


def call_env(where: str, call: Callable[[], Any], timeout_s: float) -> Any:
    """`call()`, or EnvFault when it raises or runs past `timeout_s` (0 = no limit).

    With a limit the call runs in a daemon thread: a hung env cannot be stopped in
    Python, but its thread is abandoned and can never hang the trainer or block its exit.
    """
    if timeout_s <= 0:
        outcome = _attempt(call)
    else:
        outcome = {}
        thread = threading.Thread(
            target=lambda: outcome.update(_attempt(call)), name=f"starpo-env-{where}", daemon=True
        )
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            raise EnvFault(f"{where}: no answer within env_timeout_s={timeout_s:g} s")
    if "error" in outcome:
        exc = outcome["error"]
        raise EnvFault(f"{where}: {type(exc).__name__}: {exc}") from exc
    return outcome["value"]


def record_outcome(trajectory: Trajectory, env: TextEnv) -> None:
    """A finished episode's success and, for a decision task, its answer labels (asked
    only of an env that did not error)."""
    trajectory.success = env.is_success()
    labels = env.answer()
    if labels is not None:
        trajectory.answer, trajectory.gold_answer = labels


def close_envs(episodes: list[_Episode], timeout_s: float) -> None:
    """Close every episode's env once its episode is over (a remote env ends its server
    session here); a close that raises or hangs is ignored: the episode is already played."""
    for episode in episodes:
        try:
            call_env("close", episode.env.close, timeout_s)
        except EnvFault:
            pass


def _keyed(env: TextEnv, call: Callable[[], Any]) -> tuple[Any, str]:
    """`call()` (the env's reset or step) and the digest of the env's state key after it,
    in one env call: a plugin env's state_key runs under the same timeout."""
    result = call()
    return result, state_digest(env.state_key())


@dataclass
class _Episode:
    env: TextEnv
    session: int
    trajectory: Trajectory
    state: str
    state_key: str = ""  # digest of env.state_key() for `state` (see TextEnv.state_key)
    actions_used: int = 0  # valid actions executed (invalid ones use no budget)
    last_env_reward: float = 0.0
    stop_text: str = ""
    finished: bool = False
    turn: int = 0
    # What a prompt that starts later in the dialogue rebuilds (context_window != full):
    # each turn's (state, actions left), user message, reply tokens and stop text.
    views: list[tuple[str, int]] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    replies: list[list[int]] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    # A tool-calling env's results of the last turn's calls, fed back as `tool` messages.
    tool_results: list[str] = field(default_factory=list)


class RolloutEngine:
    """Plays groups of episodes with a generation backend and records trajectories."""

    def __init__(self, backend: GenerationBackend, tokenizer: Any, settings: EpisodeSettings):
        self.backend = backend
        self.tokenizer = tokenizer
        from starpo.models import stop_token_ids  # torch: only when an engine is built

        self.settings = settings
        self.prefix = self.answer_prefix = prompts.generation_prefix(settings.think)
        self.chat = self.answer_chat = ChatTokens(tokenizer, self.prefix)
        self.generation_seconds = 0.0  # time spent in the backend, summed over runs
        self.stop_texts = self.answer_stops = (
            ANSWER_CLOSE_VARIANTS if settings.stop_at_answer else ()
        )
        stops = tuple(tuple(self.chat.encode(text)) for text in self.stop_texts)
        self.params = self.answer_params = SamplingParams(
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            stop_token_ids=tuple(stop_token_ids(tokenizer)),
            stop_sequences=stops,
        )
        # A tool-calling env's schemas -> its chat pieces (see `use_env`).
        self._tool_chats: dict[str, ChatTokens] = {}
        self.tool_schemas: list[dict[str, Any]] | None = None

    def run(
        self,
        env_id: str,
        seeds: list[int],
        group_size: int,
        *,
        env_kwargs: dict[str, Any] | None = None,
        on_turn: Callable[[int], None] | None = None,
        starts: list[Any] | None = None,
    ) -> list[Trajectory]:
        """Play `group_size` episodes from each seed (one env group per seed), from the
        seed's start or, where `starts` gives one, from that start state."""
        episodes = self._start(env_id, seeds, group_size, env_kwargs or {}, starts)
        try:
            self.use_env(episodes[0].env if episodes else None)
            return self._play_turns(episodes, on_turn)
        finally:
            close_envs(episodes, self.settings.env_timeout_s)

    def use_env(self, env: TextEnv | None) -> None:
        """Chat pieces, generation prefix and sampling for `env`'s episodes (`run` sets them
        for its env): a tool-calling env's turns end at the end of the reply (several calls
        may follow each other), start inside the think block or at the first call, and its
        results come back as `tool` messages."""
        if env is None or not is_tool_env(env):
            self.chat, self.params, self.tool_schemas = self.answer_chat, self.answer_params, None
            self.prefix, self.stop_texts = self.answer_prefix, self.answer_stops
            return
        if self.settings.context_window != "full":
            raise UserError(
                "a tool-calling env needs the whole dialogue in each prompt; set "
                "rollout.context_window=full"
            )
        schemas = env.tool_schemas()
        self.prefix = prompts.tool_generation_prefix(self.settings.think)
        key = repr(schemas)
        if key not in self._tool_chats:
            self._tool_chats[key] = ChatTokens(self.tokenizer, self.prefix, tools=schemas)
        chat = self._tool_chats[key]
        prompts.check_tool_format(
            self.settings.tool_format,
            native=chat.native_tools,
            lays_out="this model's chat template",
        )
        self.chat, self.tool_schemas = chat, schemas
        # One call a turn ends at its </tool_call> (what follows would be ignored); with
        # several, the model ends its reply itself.
        one_call = self.settings.stop_at_answer and self.settings.max_actions_per_turn == 1
        tagged = self.call_syntax == TAGGED  # a bare JSON call ends with the reply
        self.stop_texts = TOOL_CALL_CLOSE_VARIANTS if one_call and tagged else ()
        stops = tuple(tuple(self.chat.encode(text)) for text in self.stop_texts)
        self.params = replace(self.answer_params, stop_sequences=stops)

    @property
    def call_syntax(self) -> str:
        """How this run's agent writes its tool calls: its chat template's syntax."""
        return self.chat.call_syntax

    @property
    def system_prompt(self) -> str:
        """The system message of this run's episodes (with the tools of a tool env)."""
        if self.tool_schemas is None:
            return prompts.SYSTEM_PROMPT
        return prompts.tool_system_prompt(
            self.tool_schemas, native=self.chat.native_tools, tool_format=self.settings.tool_format
        )

    def _play_turns(
        self, episodes: list[_Episode], on_turn: Callable[[int], None] | None
    ) -> list[Trajectory]:
        self.backend.reset()
        for turn in range(1, self.settings.max_turns + 1):
            active = [e for e in episodes if not e.finished]
            if not active:
                break
            if self.settings.rebuilds(turn):
                # The window drops a turn: every prompt is built afresh, in new sessions
                # (all episodes are at the same turn, so they all start together).
                self.backend.reset()
            requests = [GenerationRequest(e.session, self._observe(e, turn)) for e in active]
            started = time.perf_counter()
            generations = self.backend.generate(requests, self.params)
            self.generation_seconds += time.perf_counter() - started
            for episode, generation in zip(active, generations, strict=True):
                self._act(episode, generation)
            self.backend.release(e.session for e in active if e.finished)
            if on_turn is not None:
                on_turn(turn)
        self.backend.reset()
        for episode in episodes:
            if episode.trajectory.error is None:  # an errored env is not asked again
                record_outcome(episode.trajectory, episode.env)
            episode.trajectory.final_state = episode.state
        return [e.trajectory for e in episodes]

    # ------------------------------------------------------------------------ steps
    def _start(
        self,
        env_id: str,
        seeds: list[int],
        group_size: int,
        env_kwargs: dict[str, Any],
        starts: list[Any] | None = None,
    ) -> list[_Episode]:
        episodes = []
        limit = self.settings.env_timeout_s
        if starts is not None and len(starts) != len(seeds):
            raise ValueError(f"{len(starts)} starts for {len(seeds)} seeds")
        for group, seed in enumerate(seeds):
            start = None if starts is None else starts[group]
            options = start_options(start)
            for _ in range(group_size):
                env = make(env_id, **env_kwargs)
                trajectory = Trajectory(env_id=env_id, seed=seed, group=group, start=start)
                reset = partial(env.reset, seed=seed, options=options)
                try:
                    (state, _), key = call_env("reset", partial(_keyed, env, reset), limit)
                except EnvFault as fault:
                    trajectory.error = str(fault)
                    state, key = "", ""
                episode = _Episode(env, len(episodes), trajectory, state, key)
                episode.finished = trajectory.error is not None  # never played
                episodes.append(episode)
        return episodes

    def _actions_left(self, episode: _Episode) -> int:
        """Valid actions the episode may still take: the trajectory budget or the env's."""
        return min(
            self.settings.max_actions_per_traj - episode.actions_used, episode.env.steps_left
        )

    def _observe(self, episode: _Episode, turn: int) -> list[int]:
        """The tokens fed before this turn's reply, appended to the trajectory as masked
        tokens: the next chunk of the dialogue, or the whole prompt of a context window
        that dropped a turn (`EpisodeSettings.context_window`)."""
        s, traj = self.settings, episode.trajectory
        if turn > 1 and episode.tool_results:
            return self._observe_tool_results(episode, turn)
        user = self._user_turn(episode, turn)
        if turn == 1:
            ids = self.chat.first_prompt(self.system_prompt, user)
        elif s.rebuilds(turn):
            traj.context_resets.append(len(traj.token_ids))
            ids = self._window_prompt(episode, s.window_start(turn), turn)
        else:
            ids = self.chat.next_turn(user, episode.stop_text)
        traj.token_ids.extend(ids)
        traj.loss_mask.extend([0] * len(ids))
        traj.logprobs.extend([0.0] * len(ids))
        episode.turn = turn
        return ids

    def _observe_tool_results(self, episode: _Episode, turn: int) -> list[int]:
        """The last turn's tool results as `tool` messages, fed before this turn's reply."""
        traj = episode.trajectory
        ids = self.chat.tool_results(self._tool_turn(episode), episode.stop_text)
        traj.token_ids.extend(ids)
        traj.loss_mask.extend([0] * len(ids))
        traj.logprobs.extend([0.0] * len(ids))
        episode.turn = turn
        return ids

    def _tool_turn(self, episode: _Episode) -> list[str]:
        """Record the last turn's tool results as this turn's `tool` messages (no user
        message); returns them."""
        results = episode.tool_results
        episode.views.append((episode.state, self._actions_left(episode)))
        episode.trajectory.messages.extend({"role": "tool", "content": r} for r in results)
        episode.users.append("")
        return results

    def _user_turn(self, episode: _Episode, turn: int) -> str:
        """This turn's user message, recorded in the episode and its trajectory's messages
        (after the system prompt on turn 1)."""
        s, traj = self.settings, episode.trajectory
        episode.views.append((episode.state, self._actions_left(episode)))
        if turn == 1:
            user = self._opening(episode, 1)
            traj.messages.append({"role": "system", "content": self.system_prompt})
        elif self.tool_schemas is not None:  # the last turn made no well-formed call
            user = prompts.no_call_message(
                think=s.think,
                max_response_words=s.max_response_words,
                max_calls=s.max_actions_per_turn,
                calls_left=self._actions_left(episode),
                syntax=self.call_syntax,
            )
        else:
            user = prompts.next_user_message(
                turn,
                episode.last_env_reward,
                episode.state,
                actions_left=self._actions_left(episode),
                think=s.think,
                max_response_words=s.max_response_words,
                remind=s.format_every_turn,
            )
        episode.users.append(user)
        traj.messages.append({"role": "user", "content": user})
        return user

    def _opening(self, episode: _Episode, turn: int) -> str:
        """The first user message of a prompt that starts at `turn`: the task and that
        turn's state (no reward line: the turn it rewards is not shown)."""
        s = self.settings
        state, actions_left = episode.views[turn - 1]
        if self.tool_schemas is not None:
            return prompts.tool_task_message(
                episode.env,
                state,
                max_calls=s.max_actions_per_turn,
                calls_left=actions_left,
                think=s.think,
                max_response_words=s.max_response_words,
                syntax=self.call_syntax,
            )
        return prompts.first_user_message(
            episode.env,
            state,
            max_actions_per_turn=s.max_actions_per_turn,
            actions_left=actions_left,
            think=s.think,
            max_response_words=s.max_response_words,
            turn=turn,
        )

    def _window_prompt(self, episode: _Episode, start: int, turn: int) -> list[int]:
        """The whole prompt of `turn` when it shows the dialogue from turn `start` on: the
        same chunks the full dialogue has from there (the replies' own tokens, never
        re-tokenised), opened by the task."""
        ids = self.chat.first_prompt(prompts.SYSTEM_PROMPT, self._opening(episode, start))
        for earlier in range(start, turn):  # 1-based turns shown before the current one
            ids += episode.replies[earlier - 1]
            ids += self.chat.next_turn(episode.users[earlier], episode.stops[earlier - 1])
        return ids

    def _act(self, episode: _Episode, generation: Generation) -> None:
        """Record the generated tokens, parse them, step the env, score the turn."""
        traj = episode.trajectory
        token_ids, stop_ids = generation.token_ids, generation.stop_ids
        traj.token_ids.extend(token_ids)
        traj.loss_mask.extend([1] * len(token_ids))
        traj.logprobs.extend(generation.logprobs)
        traj.turn_ends.append(len(traj.token_ids) - 1)
        text = self.prefix + self.tokenizer.decode(token_ids, skip_special_tokens=True)
        self._play_reply(
            episode,
            text,
            response_tokens=len(token_ids),
            count_tokens=lambda think: len(self.chat.encode(think)),
            finish_reason=generation.finish_reason,
        )
        ended_by_stop_token = bool(stop_ids) and stop_ids[-1] in self.params.stop_token_ids
        episode.stop_text = self.tokenizer.decode(stop_ids) if ended_by_stop_token else ""
        episode.replies.append(list(token_ids))
        episode.stops.append(episode.stop_text)

    def _play_reply(
        self,
        episode: _Episode,
        text: str,
        *,
        response_tokens: int,
        count_tokens: Callable[[str], int],
        finish_reason: str,
    ) -> Turn:
        """Parse a reply's text (with the generation prefix), step the env with its actions,
        score the turn and record it: the part of a turn that needs no tokens."""
        s, traj = self.settings, episode.trajectory
        if self.tool_schemas is not None:  # this run's env takes tool calls (`use_env`)
            parsed = parse_tool_turn(
                text, think=s.think, max_calls=s.max_actions_per_turn, syntax=self.call_syntax
            )
        else:
            parsed = parse_turn(text, think=s.think, max_actions=s.max_actions_per_turn)
        turn = Turn(
            state=episode.state,
            response=text,
            think=parsed.think,
            actions=list(parsed.actions),
            executed=[],
            format_ok=parsed.format_ok,
            env_reward=0.0,
            reward=0.0,
            response_tokens=response_tokens,
            think_tokens=count_tokens(parsed.think) if parsed.think else 0,
            finish_reason=finish_reason,
            state_key=episode.state_key,
            window_start=s.window_start(episode.turn),
        )
        episode.tool_results = []
        env_done = self._execute(episode, turn, list(parsed.actions))
        penalty = s.format_penalty if (not parsed.format_ok or turn.num_invalid) else 0.0
        turn.format_penalty = penalty
        turn.format_bonus = s.format_reward if parsed.format_ok else 0.0
        turn.reward = turn.env_reward + penalty + turn.format_bonus
        traj.turns.append(turn)
        traj.messages.append({"role": "assistant", "content": text})
        episode.last_env_reward = turn.env_reward
        traj.done = env_done
        episode.finished = (
            env_done or self._actions_left(episode) <= 0 or episode.turn >= s.max_turns
        )
        return turn

    def _execute(self, episode: _Episode, turn: Turn, actions: list[str]) -> bool:
        """Apply the turn's actions in order; return whether the env ended.

        Only valid actions use the budget (as in RAGEN and the env contract: an invalid action
        changes nothing), so a malformed action neither shortens the episode nor lowers the
        "actions left" of the next prompt. Execution stops once the budget of valid actions is
        spent or the env ends; later actions are never attempted and so never judged: they
        count neither as valid nor as invalid and earn no format penalty, just like actions
        beyond `max_actions_per_turn`, which the parser drops. This keeps
        `num_valid + num_invalid` equal to the actions actually tried. (RAGEN also penalises an
        invalid action past the budget; that only differs in a turn where the budget runs out
        or the env ends.)
        """
        env, limit = episode.env, self.settings.env_timeout_s
        for action in actions:
            if self._actions_left(episode) <= 0:
                break  # budget spent: the remaining actions are not attempted
            try:
                outcome, key = call_env(
                    "step", partial(_keyed, env, partial(env.step, action)), limit
                )
            except EnvFault as fault:
                episode.trajectory.error = str(fault)
                return True  # the episode ends here; its group is left out of the update
            state, reward, terminated, truncated, info = outcome
            episode.state, episode.state_key = state, key
            turn.env_reward += reward
            if "tool_result" in info:  # a tool-calling env: the agent reads it next turn
                episode.tool_results.append(str(info["tool_result"]))
                turn.tool_results.append(str(info["tool_result"]))
            if info["action_is_valid"]:
                episode.actions_used += 1
                turn.num_valid += 1
                turn.executed.append(info["action"])
                turn.num_effective += int(info["action_is_effective"])
                if info.get("action_is_optimal") is not None:  # envs may predate the key
                    turn.num_judged += 1
                    turn.num_optimal += int(info["action_is_optimal"])
            else:
                turn.num_invalid += 1
            if terminated or truncated:
                return True
        return False
