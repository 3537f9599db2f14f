"""What the memory plan reads before any model loads: a model's shape (from its
config.json, parameters counted on PyTorch's meta device) and the longest episode the
rollout settings allow (the env's real first prompt, tokenized). `starpo.memory.plan` turns
them into bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starpo.config.episode import prompt_rebuilt


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a model's config (and its meta-device copy)."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_dim: int  # kv_heads x head_dim
    vocab: int
    tied: bool = True  # the LM head is the input embedding
    model_type: str | None = None
    lora_params: int = 0  # adapter parameters under model.lora (0 without LoRA)
    config: Any = field(default=None, compare=False)  # the transformers config it came from

    @property
    def backbone_params(self) -> int:
        """Parameters without the LM head (a critic's copy), counted once when tied."""
        return self.params if self.tied else self.params - self.vocab * self.hidden

    @property
    def fused_params(self) -> int:
        """The q/k/v and gate/up matrices the lean backend fuses into copies."""
        h = self.hidden
        return self.layers * (h * (h + 2 * self.kv_dim) + 2 * h * self.intermediate)


@dataclass(frozen=True)
class EpisodeShape:
    """Token counts of the longest episode the rollout settings allow."""

    prompt_tokens: int  # the first prompt, shared by a group
    turn_tokens: int  # one later turn's observation chunk (turn end, user message, prefix)
    response_tokens: int  # max_new_tokens
    max_turns: int
    # Earlier turns a prompt keeps (EpisodeSettings.turns_kept); None = the whole dialogue.
    kept_turns: int | None = None

    def rebuilds(self, turn: int) -> bool:
        """Whether the prompt of `turn` (1-based) is built afresh: its window dropped a turn."""
        return prompt_rebuilt(self.kept_turns, turn)

    @property
    def window_prompt_tokens(self) -> int:
        """A rebuilt prompt: the opening, then each kept turn's reply and the next chunk."""
        kept = self.kept_turns or 0
        return self.prompt_tokens + kept * (self.response_tokens + self.turn_tokens)

    @property
    def part_lengths(self) -> list[int]:
        """Tokens of each sequence the longest episode trains as: the dialogue up to the
        first rebuilt prompt, then one sequence per rebuilt prompt (`context_window`)."""
        turns = self.max_turns
        first = next((t - 1 for t in range(1, turns + 1) if self.rebuilds(t)), turns)
        opening = self.prompt_tokens + first * self.response_tokens
        later = self.window_prompt_tokens + self.response_tokens
        return [opening + (first - 1) * self.turn_tokens] + [later] * (turns - first)

    @property
    def max_length(self) -> int:
        return sum(self.part_lengths)

    @property
    def max_response_tokens(self) -> int:
        return self.max_turns * self.response_tokens


def model_shape(name: str, lora: Any = None) -> ModelShape:
    """The shape of model `name` from its config.json; parameters counted on the meta
    device, so nothing is read but the config (the default model is converted on first use,
    as `starpo train` would)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from starpo.models.loading import _from_source, resolve_source

    config = _from_source(AutoConfig.from_pretrained, resolve_source(name))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    lora_params = 0
    if lora is not None and lora.enabled:
        from peft import LoraConfig, get_peft_model

        adapters = LoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, target_modules=lora.target_modules
        )
        wrapped = get_peft_model(model, adapters)
        lora_params = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    return ModelShape(
        params=params,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=getattr(config, "intermediate_size", 4 * config.hidden_size),
        heads=heads,
        kv_dim=kv_heads * head_dim,
        vocab=config.vocab_size,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        model_type=getattr(config, "model_type", None),
        lora_params=lora_params,
        config=config,
    )


def episode_shape(cfg: Any, tokenizer: Any, env_id: str, env_kwargs: dict) -> EpisodeShape:
    """The longest episode of `env_id` under the rollout settings: its real first prompt
    (seed 0), and a later turn's chunk with the same observation length."""
    from starpo.envs import make
    from starpo.envs.tools import is_tool_env
    from starpo.rollout import prompts
    from starpo.rollout.chat import ChatTokens

    s = cfg.rollout
    env = make(env_id, **env_kwargs)
    try:
        state, _ = env.reset(seed=0)
    finally:
        env.close()  # the state and the env's prompt text are all this reads
    if is_tool_env(env):
        return _tool_episode_shape(s, tokenizer, env, state)
    chat = ChatTokens(tokenizer, prompts.generation_prefix(s.think))
    common = dict(
        actions_left=s.max_actions_per_traj, think=s.think, max_response_words=s.max_response_words
    )
    first = prompts.first_user_message(
        env, state, max_actions_per_turn=s.max_actions_per_turn, **common
    )
    later = prompts.next_user_message(
        s.max_turns, -10.0, state, remind=s.format_every_turn, **common
    )
    return EpisodeShape(
        prompt_tokens=len(chat.first_prompt(prompts.SYSTEM_PROMPT, first)),
        turn_tokens=len(chat.next_turn(later)),
        response_tokens=s.max_new_tokens,
        max_turns=s.max_turns,
        kept_turns=s.settings().turns_kept,
    )


def _tool_episode_shape(s: Any, tokenizer: Any, env: Any, state: str) -> EpisodeShape:
    """A tool env's episode as the engine lays it out: the system message with its tools
    (unless the template lays them out), the task and case, and later turns of tool
    results, each taken as long as the case text (the results of the shipped tool envs are
    no longer than their cases)."""
    from starpo.rollout import prompts
    from starpo.rollout.chat import ChatTokens

    schemas = env.tool_schemas()
    chat = ChatTokens(tokenizer, prompts.tool_generation_prefix(s.think), tools=schemas)
    first = prompts.tool_task_message(
        env,
        state,
        max_calls=s.max_actions_per_turn,
        calls_left=s.max_actions_per_traj,
        think=s.think,
        max_response_words=s.max_response_words,
        syntax=chat.call_syntax,
    )
    system = prompts.tool_system_prompt(
        schemas, native=chat.native_tools, tool_format=s.tool_format
    )
    return EpisodeShape(
        prompt_tokens=len(chat.first_prompt(system, first)),
        turn_tokens=len(chat.tool_results([state] * s.max_actions_per_turn)),
        response_tokens=s.max_new_tokens,
        max_turns=s.max_turns,
        kept_turns=None,
    )
