"""`starpo eval --policy api`: episodes played by an OpenAI-compatible chat model.

The dialogue is the rollout engine's own: `ApiPlayer` is a `RolloutEngine` without a
tokenizer or backend, so the user messages, the parser, the env steps, the rewards and the
`Turn` records are the engine's code (`_user_turn`, `_play_reply`); only the reply comes
from a chat completion. API turns have no token ids (`Trajectory.token_ids` stays empty);
`Trajectory.usage` holds the token counts the API reported and `wall_s` the episode's time.

Tool-calling envs use the API's own function calling: the tools go in the request's
`tools` parameter, the reply's `tool_calls` become the engine's `<tool_call>` blocks (so
the same parser and env judge them), and each result goes back as a `tool` message with
its call's id. A model that writes `<tool_call>` blocks in its text is read as well.

Retries: the openai client's own (`max_retries`, exponential backoff on connection errors,
timeouts, 408, 409, 429 and 5xx); an episode whose request still fails is recorded with
`Trajectory.error` ("api: ...") and the other episodes go on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starpo.config.episode import EpisodeSettings
from starpo.envs.tools import is_tool_env
from starpo.errors import UserError
from starpo.rollout import prompts
from starpo.rollout.engine import RolloutEngine, _Episode, close_envs, record_outcome
from starpo.rollout.parser import TAGGED
from starpo.types import Trajectory

#: Sent as the key when its environment variable is unset (servers without auth).
NO_KEY = "none"
ANSWER_CLOSE = "</answer>"


def make_client(base_url: str, api_key: str, *, timeout_s: float, max_retries: int) -> Any:
    """The sync openai client; its own retries (exponential backoff) are the ones used."""
    try:
        import openai
    except ImportError as exc:
        raise UserError("--policy api needs the openai package: pip install openai") from exc
    return openai.OpenAI(
        base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries
    )


def check_server(client: Any, model: str | None, *, key_env: str = "OPENAI_API_KEY") -> str:
    """The model to ask, checked once before any episode with GET /v1/models: a wrong key,
    an unreachable URL or an unknown model is a one-line UserError with the fix."""
    import openai

    url = str(client.base_url).rstrip("/")
    try:
        listed = [m.id for m in client.models.list()]
    except openai.AuthenticationError as exc:
        raise UserError(
            f"{url} refused the API key ({exc.status_code}): export the right key as "
            f"{key_env} (or name its variable with --api-key-env)"
        ) from None
    except openai.NotFoundError:
        raise UserError(
            f"{url} has no /models endpoint: --base-url should end with /v1 "
            "(e.g. http://127.0.0.1:8000/v1)"
        ) from None
    except openai.APIConnectionError:
        raise UserError(f"cannot reach {url}: is the server running, and the URL right?") from None
    except openai.APIStatusError as exc:
        raise UserError(f"{url} answered {exc.status_code} to GET /models: {exc}") from None
    if model is None:
        if len(listed) != 1:
            names = ", ".join(listed) or "none"
            raise UserError(
                f"{url} lists {len(listed)} models ({names}): pick one with --api-model"
            )
        return listed[0]
    if listed and model not in listed:
        raise UserError(f"{url} has no model {model!r}; it lists: {', '.join(listed)}")
    return model


class ApiPlayer(RolloutEngine):
    """Plays episodes with a chat completions API, up to `concurrency` at once (threads)."""

    def __init__(
        self,
        client: Any,
        model: str,
        settings: EpisodeSettings,
        *,
        concurrency: int = 8,
        prefill: bool = False,
    ) -> None:
        # No tokenizer, backend or token chunks: only what `_user_turn` and `_play_reply` use.
        self.client, self.model, self.settings = client, model, settings
        self.concurrency, self.prefill = concurrency, prefill
        self.prefix = self.answer_prefix = prompts.generation_prefix(settings.think)
        self.tool_schemas: list[dict[str, Any]] | None = None
        self.generation_seconds = 0.0  # time waiting for replies, summed over episodes
        self._lock = threading.Lock()
        # A tool env's dialogue as the API takes it (assistant tool_calls, tool messages
        # with their ids), per episode session.
        self._chats: dict[int, list[dict[str, Any]]] = {}

    def use_env(self, env: Any) -> None:
        """A tool env's tools go in each request (`tools`); the prompt ends as the engine's."""
        if env is None or not is_tool_env(env):
            self.tool_schemas, self.prefix = None, self.answer_prefix
            return
        if self.settings.context_window != "full":
            raise UserError(
                "a tool-calling env needs the whole dialogue in each prompt; set "
                "--context-window full"
            )
        prompts.check_tool_format(self.settings.tool_format, native=True, lays_out="the API")
        self.tool_schemas = env.tool_schemas()
        self.prefix = prompts.tool_generation_prefix(self.settings.think)

    @property
    def system_prompt(self) -> str:
        return prompts.SYSTEM_PROMPT  # the tools travel as the request's `tools`

    @property
    def call_syntax(self) -> str:
        return TAGGED  # the API's native calls become <tool_call> blocks (`_tool_reply`)

    def run(
        self,
        env_id: str,
        seeds: list[int],
        group_size: int,
        *,
        env_kwargs: dict[str, Any] | None = None,
        on_turn: Callable[[int], None] | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Play `group_size` episodes from each seed; `on_episode(trajectory)` as each ends
        (from its worker thread), `on_turn(turn)` after each turn of any episode."""
        episodes = self._start(env_id, seeds, group_size, env_kwargs or {})
        self.use_env(episodes[0].env if episodes else None)
        self._chats = {}  # sessions count from 0 again in every run

        def play(episode: _Episode) -> Trajectory:
            started = time.perf_counter()
            episode.trajectory.usage = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0}
            try:
                self._play(episode, on_turn)
            except Exception as exc:  # noqa: BLE001 - a failed request ends only its episode
                episode.trajectory.error = f"api: {type(exc).__name__}: {exc}"
            traj = episode.trajectory
            if traj.error is None:
                record_outcome(traj, episode.env)
            traj.final_state = episode.state
            traj.wall_s = time.perf_counter() - started
            if on_episode is not None:
                on_episode(traj)
            return traj

        try:
            with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
                return list(pool.map(play, episodes))
        finally:
            close_envs(episodes, self.settings.env_timeout_s)

    def _play(self, episode: _Episode, on_turn: Callable[[int], None] | None) -> None:
        for turn in range(1, self.settings.max_turns + 1):
            if episode.finished:
                return
            if self.tool_schemas is not None and turn > 1 and episode.tool_results:
                self._tool_turn(episode)
            else:
                self._user_turn(episode, turn)
            episode.turn = turn
            text, finish, completion_tokens = self._reply(episode, turn)
            self._play_reply(
                episode,
                text,
                response_tokens=completion_tokens,
                count_tokens=lambda think: 0,  # no tokenizer: the API counts only whole replies
                finish_reason=finish,
            )
            if on_turn is not None:
                on_turn(turn)

    def _messages(self, episode: _Episode, turn: int) -> list[dict[str, Any]]:
        """The chat the engine's prompt of `turn` renders: the whole dialogue, or from the
        context window's first turn on (opened by the task, as `_window_prompt` does)."""
        if self.tool_schemas is not None:
            return self._tool_messages(episode)
        start = self.settings.window_start(turn)
        users = [self._opening(episode, start) if start > 1 else episode.users[0]]
        users += episode.users[start:turn]
        replies = [t.response for t in episode.trajectory.turns[start - 1 : turn - 1]]
        messages = [{"role": "system", "content": prompts.SYSTEM_PROMPT}]
        for i, user in enumerate(users):
            messages.append({"role": "user", "content": user})
            if i < len(replies):
                messages.append({"role": "assistant", "content": replies[i]})
        return messages

    def _tool_messages(self, episode: _Episode) -> list[dict[str, Any]]:
        """A tool env's dialogue in the API's form: the trajectory's messages, with each
        assistant turn as the API sent it (its `tool_calls`) and each result as a `tool`
        message answering its call's id."""
        sent = self._chats.get(episode.session, [])  # assistant messages as received
        out: list[dict[str, Any]] = []
        calls: list[str] = []  # ids of the last assistant turn's calls, in order
        replies = 0
        for message in episode.trajectory.messages:
            if message["role"] == "assistant":
                out.append(sent[replies])
                calls = [c["id"] for c in sent[replies].get("tool_calls") or []]
                replies += 1
            elif message["role"] == "tool" and calls:
                out.append({"role": "tool", "tool_call_id": calls.pop(0), **message})
            elif message["role"] == "tool":  # calls written as text: results as a user turn
                out.append(
                    {
                        "role": "user",
                        "content": f"<tool_response>\n{message['content']}\n</tool_response>",
                    }
                )
            else:
                out.append(dict(message))
        for missing in calls:  # calls past the budget or after the env ended: never run
            out.append({"role": "tool", "tool_call_id": missing, "content": "Error: not run"})
        return out

    def _reply(self, episode: _Episode, turn: int) -> tuple[str, str, int]:
        """The turn's reply text as the engine would hold it (starting with the generation
        prefix), its finish reason and its completion tokens."""
        s = self.settings
        messages = self._messages(episode, turn)
        extra: dict[str, Any] = {}
        if self.prefill:
            # The engine's prompt ends with the prefix inside the assistant turn. Servers with
            # vLLM's continuation fields (vLLM, starpo serve) continue a final assistant
            # message exactly so: the same prompt, hence the same reply as the engine's.
            messages.append({"role": "assistant", "content": self.prefix})
            extra = {"continue_final_message": True, "add_generation_prompt": False}
        tools = {} if self.tool_schemas is None else {"tools": self.tool_schemas}
        started = time.perf_counter()
        response = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            extra_body=extra or None,
            **tools,
        )
        with self._lock:
            self.generation_seconds += time.perf_counter() - started
        usage, traj_usage = response.usage, episode.trajectory.usage
        assert traj_usage is not None
        traj_usage["requests"] += 1
        completion_tokens = 0
        if usage is not None:
            traj_usage["prompt_tokens"] += usage.prompt_tokens or 0
            completion_tokens = usage.completion_tokens or 0
            traj_usage["completion_tokens"] += completion_tokens
        choice = response.choices[0]
        if self.tool_schemas is not None:
            return self._tool_reply(episode, choice), _finish(choice), completion_tokens
        text = self._text(choice.message.content or "", _reasoning(choice.message))
        finish = _finish(choice)
        end = text.find(ANSWER_CLOSE)
        if s.stop_at_answer and end >= 0 and end + len(ANSWER_CLOSE) < len(text):
            # The engine stops generating at </answer> and keeps it. No stop string is sent:
            # an API leaves a stop string out of the reply and does not say whether it or
            # end-of-turn ended it, so the reply is cut here instead.
            text, finish = text[: end + len(ANSWER_CLOSE)], "stop"
        return text, finish, completion_tokens

    def _tool_reply(self, episode: _Episode, choice: Any) -> str:
        """A tool env's reply in the engine's form (its calls as `<tool_call>` blocks after
        the think block), and the assistant message kept to send back as received."""
        message = choice.message
        content, reasoning = message.content or "", _reasoning(message)
        native = list(message.tool_calls or [])
        kept: dict[str, Any] = {"role": "assistant", "content": content}
        if native:
            kept["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in native
            ]
        with self._lock:
            self._chats.setdefault(episode.session, []).append(kept)
        if not native:  # calls written as text, if any: read as the engine reads a reply
            return self._text(content, reasoning)
        blocks = "".join(f"<tool_call>{_call_text(call.function)}</tool_call>" for call in native)
        if not self.settings.think:
            return blocks
        thought = (reasoning or content).replace("</think>", "").removeprefix("<think>")
        return f"<think>{thought}</think>{blocks}"

    def _text(self, content: str, reasoning: str | None) -> str:
        """The reply in the engine's form: the prefix first, any separate reasoning as the
        think block."""
        if reasoning and self.settings.think and not content.lstrip().startswith("<think>"):
            # A provider's reasoning field is the turn's think block.
            content = f"<think>{reasoning.strip()}</think>{content}"
        elif self.prefill:
            content = self.prefix + content
        elif not content.lstrip().startswith(self.prefix):
            # Without a continuation the chat API cannot pre-fill the prefix the engine ends
            # its prompt with, so it is prepended unless the model wrote it itself.
            content = self.prefix + content
        return content


def _finish(choice: Any) -> str:
    return "length" if choice.finish_reason == "length" else "stop"


def _call_text(function: Any) -> str:
    """A native call as the env reads it: its arguments (a JSON string) parsed where they
    are JSON, else kept as text for the env to refuse with a reason."""
    import json

    try:
        arguments = json.loads(function.arguments or "{}")
    except json.JSONDecodeError:
        arguments = function.arguments
    return json.dumps({"name": function.name, "arguments": arguments}, ensure_ascii=False)


def _reasoning(message: Any) -> str | None:
    """A provider's separate reasoning text (`reasoning_content` or `reasoning`), if any."""
    for name in ("reasoning_content", "reasoning"):
        value = getattr(message, name, None)
        if value is None:
            value = (getattr(message, "model_extra", None) or {}).get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None
