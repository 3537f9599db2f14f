"""Peak memory of a training run, estimated from its config before any model loads.

`starpo plan --config FILE` prints the estimate part by part; `starpo train` refuses a
config whose estimate exceeds the machine's memory and names a setting that fits.

The model's shape comes from its config.json, its parameter count from an empty copy on
PyTorch's meta device (no weights are read); episode lengths come from the real first
prompt of the env, tokenized, plus `max_new_tokens` and one observation per later turn.
The estimate is for the worst case the config allows (every episode runs `max_turns`
turns of `max_new_tokens` tokens), so a run whose agent answers briefly stays below it.

What one process holds (bytes; P = parameters, T = trainable parameters):

- the Python runtime with torch, transformers and the tokenizer (`RUNTIME_BYTES`);
- the policy in fp32 (4P; LoRA's frozen base in the compute dtype), the critic likewise,
  the reference in the compute dtype, the rollout's bf16 weight copy (2P, lean backend);
- AdamW's two fp32 moments (8T), from the first optimizer step on;
- then the larger of two phases:
  - rollout: the KV cache of every episode played at once (fp32 keys and values in the
    lean backend), grown 1.5x at a time as `KVStore` does;
  - update: fp32 gradients (4T), the activations autograd keeps for one micro-batch
    (bytes per token and layer measured for Llama decoders: see `LAYER_BYTES_*`), the
    logits the LM head keeps for its response tokens, and autocast's bf16 weight copies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starpo.errors import UserError
from starpo.logs import warn

GiB = 2**30
#: RSS of a Python process that has imported torch, transformers and starpo's trainer and
#: loaded the tokenizer, before any model (measured: 0.38 GB on Linux, torch 2.13 CPU).
RUNTIME_BYTES = int(0.38 * GiB)
#: Per-token-per-layer activation bytes autograd saves in a Llama decoder layer, fitted on
#: six layer shapes (saved-tensor hooks; exact to 0.1%): a.h + b.i + c.kv + d.heads with
#: h hidden size, i MLP size, kv = kv_heads x head_dim.
LAYER_BYTES_FP32 = (32, 16, 8, 6)
LAYER_BYTES_AUTOCAST = (30, 8, 4, 6)
#: Per-token bytes outside the layers (embedding output, final norm), per hidden unit.
OUTSIDE_LAYER_BYTES = 9
#: Adam's moments are fp32: 8 bytes per trainable parameter; gradients 4.
ADAM_BYTES, GRAD_BYTES = 8, 4


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

    @property
    def max_length(self) -> int:
        turns = self.max_turns
        return self.prompt_tokens + turns * self.response_tokens + (turns - 1) * self.turn_tokens

    @property
    def max_response_tokens(self) -> int:
        return self.max_turns * self.response_tokens


@dataclass
class MemoryPlan:
    """Bytes per part; `peak` = always-held parts + the larger phase."""

    held: dict[str, int] = field(default_factory=dict)
    rollout: dict[str, int] = field(default_factory=dict)
    update: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    processes: dict[str, tuple[int, int]] = field(default_factory=dict)  # name: (count, bytes)

    @property
    def driver_peak(self) -> int:
        return sum(self.held.values()) + max(sum(self.rollout.values()), sum(self.update.values()))

    @property
    def peak(self) -> int:
        """The whole machine: the driver plus any Ray worker and learner processes."""
        return self.driver_peak + sum(n * b for n, b in self.processes.values())

    @property
    def peak_phase(self) -> str:
        return "rollout" if sum(self.rollout.values()) > sum(self.update.values()) else "update"


# ---- the model and the episodes ------------------------------------------------------------


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
    )


def episode_shape(cfg: Any, tokenizer: Any, env_id: str, env_kwargs: dict) -> EpisodeShape:
    """The longest episode of `env_id` under the rollout settings: its real first prompt
    (seed 0), and a later turn's chunk with the same observation length."""
    from starpo.envs import make
    from starpo.rollout import prompts
    from starpo.rollout.chat import ChatTokens

    s = cfg.rollout
    env = make(env_id, **env_kwargs)
    state, _ = env.reset(seed=0)
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
    )


# ---- the estimate -----------------------------------------------------------------------------


def _dtype_bytes(dtype: Any) -> int:
    import torch

    return torch.finfo(dtype).bits // 8


def activation_bytes_per_token(shape: ModelShape, autocast: bool, checkpointed: bool) -> int:
    """Bytes autograd keeps per token of a training forward (see `LAYER_BYTES_*`). With
    gradient checkpointing each layer keeps only its input; one layer's activations are
    recomputed at a time in backward."""
    a, b, c, d = LAYER_BYTES_AUTOCAST if autocast else LAYER_BYTES_FP32
    layer = a * shape.hidden + b * shape.intermediate + c * shape.kv_dim + d * shape.heads
    outside = OUTSIDE_LAYER_BYTES * shape.hidden
    if checkpointed:
        return shape.layers * 4 * shape.hidden + layer + outside
    return shape.layers * layer + outside


def kv_cache_bytes(
    shape: ModelShape, rows: int, episode: EpisodeShape, item_bytes: int, prompts: int = 0
) -> int:
    """Keys and values of `rows` episodes at their longest, with `KVStore`'s growth: room
    for a whole turn is asked at once and grows at least 1.5x, in steps of 8 columns.
    `prompts` < rows (the lean backend, rollouts of a group starting from one prompt): the
    first prompt is held once per distinct prompt (`KVStore.share`) and each row's own
    buffer holds the columns after it."""
    shared = 0 < prompts < rows
    capacity, length = 0, 0
    for turn in range(episode.max_turns):
        if turn:
            length += episode.turn_tokens
        elif not shared:
            length += episode.prompt_tokens
        need = length + 1 + episode.response_tokens  # LeanBackend.generate's room
        if need > capacity:
            capacity = -(-max(need, capacity * 3 // 2) // 8) * 8
        length += episode.response_tokens
    columns = rows * capacity + (prompts * episode.prompt_tokens if shared else 0)
    return columns * shape.layers * 2 * shape.kv_dim * item_bytes


@dataclass(frozen=True)
class Runtime:
    """The numeric choices the trainer would make (see `Trainer.__init__`)."""

    compute_dtype: Any  # the update's dtype (bf16 autocast or fp32)
    decode_dtype: Any  # the rollout's weights
    lean: bool  # the lean backend (fp32 KV cache, its own weight copy when decode_dtype differs)
    packed: bool = False  # the lean backend's matrices packed for oneDNN (a copy of each)


def runtime_for(cfg: Any, model_type: str | None) -> Runtime:
    """What `Trainer.__init__` would pick for this config, without building anything."""
    import torch

    from starpo.models.loading import resolve_device
    from starpo.models.precision import compute_dtype, rollout_dtype
    from starpo.rollout.lean_backend import LEAN_MODEL_TYPES
    from starpo.rollout.linear_kernels import onednn_applies

    device = resolve_device(cfg.model.device)
    compute = compute_dtype(cfg.model.dtype, device)
    decode = rollout_dtype(cfg.rollout.dtype, compute, device)
    backend = cfg.rollout.backend
    on_cpu = device.type == "cpu"
    llama_like = model_type in LEAN_MODEL_TYPES and not cfg.model.lora.enabled
    lean = backend == "lean" or (backend == "auto" and on_cpu and llama_like)
    decode = decode if decode is not None else torch.float32
    packed = lean and onednn_applies(decode, device) is None
    return Runtime(compute, decode, lean, packed)


def _micro_tokens(micro: int, group_size: int, episode: EpisodeShape) -> tuple[int, int]:
    """(actor, critic) tokens of one training forward over `micro` trajectories padded to
    the longest episode. The actor encodes a prefix every row shares once: the first prompt
    when the micro-batch is one group; the critic encodes every row in full."""
    length = episode.max_length
    shared = episode.prompt_tokens if 1 < micro <= group_size else 0
    return shared + micro * (length - shared), micro * length


def plan_memory(
    cfg: Any, shape: ModelShape, train: EpisodeShape, val: EpisodeShape | None = None
) -> MemoryPlan:
    """The peak-memory estimate of `starpo train` with config `cfg` (see the module doc)."""
    run = runtime_for(cfg, shape.model_type)
    plan = MemoryPlan(held=held_parts(cfg, shape, run))
    rollout = rollout_parts(cfg, shape, run, train, val or train)
    workers = cfg.rollout.workers
    if workers:  # each Ray worker holds a policy replica and its own share of the KV cache
        worker = RUNTIME_BYTES + 4 * shape.params + _decode_copy(shape, run)
        plan.processes["Ray rollout worker"] = (workers, worker + sum(rollout.values()))
        plan.notes.append(f"rollouts run on {workers} Ray worker(s), each with its KV cache")
    else:
        plan.rollout = rollout
    plan.update = update_parts(cfg, shape, run, train)
    learners = cfg.trainer.learners
    if learners > 1:
        replica = sum(plan.held.values()) + sum(plan.update.values())
        plan.processes["Ray learner replica"] = (learners - 1, replica)
        plan.notes.append(f"{learners - 1} learner replica(s) each hold the models and AdamW state")
    if workers or learners > 1:
        plan.notes.append("Ray processes are estimated as whole processes, not measured")
    return plan


def _decode_copy(shape: ModelShape, run: Runtime) -> int:
    """The lean backend's weights: fused q/k/v and gate/up copies in fp32, plus a packed
    copy of every matrix (the head too) for oneDNN; every weight in a lower decode dtype;
    the HF backend decodes on the training weights."""
    import torch

    if not run.lean:
        return 0
    if run.decode_dtype != torch.float32:
        return shape.params * _dtype_bytes(run.decode_dtype)
    packed = shape.params if run.packed else 0  # beside the dense fused copies it re-packs
    return (shape.fused_params + packed) * 4


def held_parts(cfg: Any, shape: ModelShape, run: Runtime) -> dict[str, int]:
    """What the process holds for the whole run (AdamW's moments from the first step)."""
    compute = _dtype_bytes(run.compute_dtype)
    lora = cfg.model.lora.enabled
    trainable = trainable_parameters(cfg, shape)
    actor_trainable = shape.lora_params if lora else shape.params
    held = {"runtime (Python, torch, transformers, tokenizer)": RUNTIME_BYTES}
    if lora:
        held["policy: frozen base + fp32 LoRA adapters"] = (
            shape.params * compute + 4 * actor_trainable
        )
    else:
        held["policy weights (fp32 master)"] = 4 * shape.params
    if cfg.algorithm.uses_critic:
        frozen = shape.backbone_params * compute if lora else 0
        held["critic weights"] = frozen + 4 * (trainable - actor_trainable)
    if cfg.algorithm.uses_reference and not lora:
        held["reference policy"] = shape.params * compute
    if run.lean:
        dtype = str(run.decode_dtype).removeprefix("torch.")
        held[f"rollout weight copy ({dtype})"] = _decode_copy(shape, run)
    held["AdamW moments (from step 1)"] = ADAM_BYTES * trainable
    if cfg.trainer.checkpoint_async:  # the snapshot's memory is kept for the next save
        held["async checkpoint snapshot (from the first save)"] = checkpoint_size(cfg, shape)
    return held


def rollout_parts(
    cfg: Any, shape: ModelShape, run: Runtime, train: EpisodeShape, val: EpisodeShape
) -> dict[str, int]:
    """The rollout phase: every episode of a training step (or a validation batch) is
    played at once, so the KV cache holds all of them (split over Ray workers if any)."""
    import torch

    s, t = cfg.rollout, cfg.trainer
    split = max(s.workers, 1)
    kv_item = 4 if run.lean else _dtype_bytes(run.decode_dtype)  # lean: fp32 keys, values
    train_rows = -(-s.num_groups * s.group_size // split)
    val_rows = -(-min(t.val_batch_size, t.val_seeds * t.val_group_size) // split)
    # Lean rollouts hold a prompt once for the rows that start from it (one per env group).
    train_prompts = -(-s.num_groups // split) if run.lean else 0
    val_prompts = -(-val_rows // t.val_group_size) if run.lean else 0
    kv, rows, which, episode = max(
        (kv_cache_bytes(shape, rows, episode, kv_item, prompts), rows, which, episode)
        for rows, episode, which, prompts in (
            (train_rows, train, "training", train_prompts),
            (val_rows, val, "validation", val_prompts),
        )
    )
    parts = {
        f"KV cache ({rows} {which} episodes x {episode.max_length} tokens)": kv,
        "decode logits": rows * shape.vocab * 4 * 2,
    }
    if not run.lean and run.decode_dtype != torch.float32 and not cfg.model.lora.enabled:
        parts["autocast weight copies"] = shape.params * _dtype_bytes(run.decode_dtype)
    return parts


def update_parts(cfg: Any, shape: ModelShape, run: Runtime, train: EpisodeShape) -> dict[str, int]:
    """The update phase: gradients and what one micro-batch's forward keeps for backward."""
    import torch

    micro = cfg.optim.micro_batch_size
    actor_tokens, critic_tokens = _micro_tokens(micro, cfg.rollout.group_size, train)
    autocast = run.compute_dtype != torch.float32
    per_token = activation_bytes_per_token(shape, autocast, cfg.model.gradient_checkpointing)
    critic = cfg.algorithm.uses_critic
    parts = {
        "gradients (fp32)": GRAD_BYTES * trainable_parameters(cfg, shape),
        f"actor activations ({micro} episodes, {actor_tokens} tokens)": actor_tokens * per_token,
    }
    if critic:
        parts[f"critic activations ({critic_tokens} tokens)"] = critic_tokens * per_token
    # The head runs on every position where any row of the micro-batch has an agent token:
    # rows of unequal length put their turns at different positions, so up to the whole tail.
    positions = min(micro * train.max_response_tokens, train.max_length - train.prompt_tokens)
    parts[f"LM-head logits kept for backward ({micro} x {positions} positions)"] = (
        micro * positions * shape.vocab * 4
    )
    if autocast and not cfg.model.lora.enabled:
        parts["autocast bf16 weight copies"] = 2 * shape.params * (2 if critic else 1)
    return parts


@dataclass(frozen=True)
class ConfigPlan:
    """A config's estimate with what it was computed from (to try other settings)."""

    cfg: Any
    shape: ModelShape
    train: EpisodeShape
    val: EpisodeShape
    plan: MemoryPlan


def plan_config(cfg: Any) -> ConfigPlan:
    """`plan_memory` for a loaded config: reads the model's config and tokenizer only."""
    from starpo.models import load_tokenizer

    shape = model_shape(cfg.model.name, cfg.model.lora)
    tokenizer = load_tokenizer(cfg.model.name)
    train = episode_shape(cfg, tokenizer, cfg.env.id, cfg.env.kwargs)
    val = episode_shape(cfg, tokenizer, cfg.env.validation_id, cfg.env.validation_kwargs)
    return ConfigPlan(cfg, shape, train, val, plan_memory(cfg, shape, train, val))


# ---- the machine, and a setting that fits ------------------------------------------------------


def machine_memory() -> int:
    """Bytes of memory this process may use: the RAM (MemTotal), or the cgroup's limit
    when a container sets a lower one."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _with(cfg: Any, overrides: dict[str, Any]) -> Any | None:
    """`cfg` with dotted overrides applied, or None when the result is not a valid config."""
    from starpo.config import config_from_dict, config_to_dict

    data = config_to_dict(cfg)
    for dotted, value in overrides.items():
        section, key = dotted.split(".")
        data[section][key] = value
    try:
        return config_from_dict(data)
    except (UserError, ValueError):
        return None


def _candidates(cfg: Any) -> list[dict[str, Any]]:
    """Settings that lower the peak, the ones that leave results unchanged first:
    smaller micro-batches (same gradients), gradient checkpointing (same gradients),
    fewer validation episodes at once (same episodes), then a smaller rollout."""
    mini, micro = cfg.optim.mini_batch_size, cfg.optim.micro_batch_size
    smaller_micro = [m for m in range(micro - 1, 0, -1) if mini % m == 0]
    steps: list[dict[str, Any]] = [{"optim.micro_batch_size": m} for m in smaller_micro]
    if not cfg.model.gradient_checkpointing:
        steps.append({"model.gradient_checkpointing": True})
        steps += [
            {"optim.micro_batch_size": m, "model.gradient_checkpointing": True}
            for m in smaller_micro
        ]
    least_micro = {"optim.micro_batch_size": smaller_micro[-1]} if smaller_micro else {}
    val = cfg.trainer.val_batch_size
    while val > 1:
        val //= 2
        steps.append(
            {**least_micro, "model.gradient_checkpointing": True, "trainer.val_batch_size": val}
        )
    return steps


def fitting_setting(
    cfg: Any, shape: ModelShape, train: EpisodeShape, val: EpisodeShape, available: int
) -> tuple[dict[str, Any], MemoryPlan] | None:
    """The first of `_candidates` whose estimate fits in `available` bytes (with the plan),
    or None when none does."""
    for overrides in _candidates(cfg):
        changed = _with(cfg, overrides)
        if changed is None:
            continue
        plan = plan_memory(changed, shape, train, val)
        if plan.peak <= available:
            return overrides, plan
    return None


def format_overrides(overrides: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()
    )


def _gb(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def format_plan(planned: ConfigPlan, available: int) -> str:
    """The estimate part by part, the peak against the machine, and a setting that fits."""
    plan, cfg = planned.plan, planned.cfg
    width = max(len(k) for part in (plan.held, plan.rollout, plan.update) for k in part) + 2
    lines = [
        f"memory plan for {cfg.model.name} on {cfg.env.id} (worst case: every episode "
        f"{planned.train.max_turns} turns of {planned.train.response_tokens} new tokens)"
    ]
    for title, part in (
        ("held all run", plan.held),
        ("rollout phase", plan.rollout),
        ("update phase", plan.update),
    ):
        if part:
            lines.append(f"{title}:")
            lines += [f"  {k:<{width}}{_gb(v):>10}" for k, v in part.items()]
    for name, (count, each) in plan.processes.items():
        lines.append(f"{name} x {count}: {_gb(each)} each")
    lines += [f"note: {note}" for note in plan.notes]
    disk = checkpoint_size(cfg, planned.shape)
    lines.append(f"one checkpoint on disk: {_gb(disk)} ({cfg.trainer.checkpoint_contents})")
    lines.append(
        f"peak (in the {plan.peak_phase} phase): {_gb(plan.peak)}; this machine: {_gb(available)}"
    )
    if plan.peak <= available:
        lines.append("fits")
    else:
        lines.append(f"does not fit: {advice(planned, available)}")
    return "\n".join(lines)


def advice(planned: ConfigPlan, available: int) -> str:
    """A setting that fits, with its estimate, or what to change when none of ours does."""
    found = fitting_setting(planned.cfg, planned.shape, planned.train, planned.val, available)
    if found is None:
        return (
            "no micro-batch, checkpointing or validation batch setting fits; use fewer "
            "rollout.num_groups, a shorter rollout.max_turns or max_new_tokens, "
            "model.lora.enabled=true, or a larger machine"
        )
    overrides, plan = found
    return f"e.g. {format_overrides(overrides)} (estimated {_gb(plan.peak)})"


def check_fits(cfg: Any) -> None:
    """A one-line UserError when the config's estimated peak exceeds this machine's memory
    (`starpo train`, before any model loads)."""
    available = machine_memory()
    try:
        planned = plan_config(cfg)
    except UserError:
        raise  # the model or env cannot be found: training would fail the same way
    except Exception as exc:  # a model shape the estimate does not know: train anyway
        warn(f"memory check skipped: no estimate for this model ({exc})", "starpo.plan")
        return
    if planned.plan.peak > available:
        raise UserError(
            f"this config's estimated peak memory is {_gb(planned.plan.peak)}, more than this "
            f"machine's {_gb(available)}; {advice(planned, available)}. `starpo plan` shows "
            "the parts; trainer.memory_check=false skips this check"
        )


def trainable_parameters(cfg: Any, shape: ModelShape) -> int:
    """Parameters the optimizer updates: the policy's (or its LoRA adapters) and, with a
    critic, the critic's backbone (or adapters) and value head."""
    lora = cfg.model.lora.enabled
    actor = shape.lora_params if lora else shape.params
    if not cfg.algorithm.uses_critic:
        return actor
    return actor + (shape.lora_params if lora else shape.backbone_params) + shape.hidden + 1


def checkpoint_size(cfg: Any, shape: ModelShape) -> int:
    """Bytes of one checkpoint on disk: the fp32 trainable weights, plus AdamW's two moments
    unless trainer.checkpoint_contents=weights (`Trainer.checkpoint_estimate` after build)."""
    per_parameter = 12 if cfg.trainer.checkpoint_contents == "full" else 4
    return per_parameter * trainable_parameters(cfg, shape)


def planned_checkpoint_size(cfg: Any) -> int | None:
    """`checkpoint_size` from the model's config alone (for the free-space check before the
    model loads); None for a model whose shape cannot be read that way."""
    try:
        return checkpoint_size(cfg, model_shape(cfg.model.name, cfg.model.lora))
    except UserError:
        raise  # no such model: loading it would fail the same way
    except Exception:  # an unusual architecture: the check runs once the model is built
        return None


def measured_peak_rss(command: list[str], log: Path) -> int:
    """Run `command` and return its peak resident set size in bytes (Linux: the child's own
    `ru_maxrss` from wait4); its stderr goes to `log`. A failing command is a RuntimeError
    with the end of that log. For checking estimates (tests, bench/bench_memory.py)."""
    import subprocess

    with open(log, "w") as err:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise RuntimeError(f"{command[:6]} failed:\n{Path(log).read_text()[-2000:]}")
    return usage.ru_maxrss * 1024  # kilobytes on Linux
