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
    lean backend), grown 1.5x at a time as `KVStore` does (the HF backend's cache also
    holds two layers more as it grows a token), and a decode step's sampling matrices;
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
from starpo.memory.shapes import EpisodeShape, ModelShape, episode_shape, model_shape

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
#: (rows, vocab) fp32 matrices a decode step holds while it samples: the logits, their
#: log-probs and probabilities; top-p adds the sorted probabilities, their int64 order (two)
#: and the mass before each (measured on SmolLM2's vocabulary: 3.4 and 6.9).
SAMPLING_MATRICES, TOP_P_SAMPLING_MATRICES = 3, 7
#: Layers' keys and values the HF backend's cache holds beyond its own while it grows: the
#: layer being copied one token longer (old and new) and the blocks the layer before freed,
#: a token too small to reuse (the 50M bandit test measured ~2.8 layers' worth).
HF_CACHE_GROWTH_LAYERS = 2
#: Adam's moments are fp32: 8 bytes per trainable parameter; gradients 4.
ADAM_BYTES, GRAD_BYTES = 8, 4


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
    capacity, length, peak = 0, 0, 0
    for turn in range(episode.max_turns):
        if episode.rebuilds(turn + 1):  # new sessions: the buffers start over
            capacity, length = 0, episode.window_prompt_tokens
        elif turn:
            length += episode.turn_tokens
        elif not shared:
            length += episode.prompt_tokens
        need = length + 1 + episode.response_tokens  # LeanBackend.generate's room
        if need > capacity:
            capacity = -(-max(need, capacity * 3 // 2) // 8) * 8
        peak = max(peak, capacity)
        length += episode.response_tokens
    columns = rows * peak + (prompts * episode.prompt_tokens if shared else 0)
    return columns * shape.layers * 2 * shape.kv_dim * item_bytes


@dataclass(frozen=True)
class Runtime:
    """The numeric choices the trainer would make (see `Trainer.__init__`)."""

    compute_dtype: Any  # the update's dtype (bf16 autocast or fp32)
    decode_dtype: Any  # the rollout's weights
    lean: bool  # the lean backend (its own weight copy when decode_dtype differs)
    packed: bool = False  # the lean backend's matrices packed for oneDNN (a copy of each)
    kv_item_bytes: int = 4  # the lean backend's cache entries (rollout.kv_dtype)


def runtime_for(cfg: Any, model_type: str | None, model_config: Any = None) -> Runtime:
    """What `Trainer.__init__` would pick for this config, without building anything.
    `model_config`: the model's transformers config, for the lean decoder's checks beyond
    the model type (activation, sliding window); the backend choice is the one
    `rollout.lean_backend.auto_picks_lean` makes. A plugin backend is planned as `hf`."""
    from types import SimpleNamespace

    import torch

    from starpo.models.loading import resolve_device, resolve_dtype
    from starpo.models.precision import compute_dtype, rollout_dtype
    from starpo.rollout.backends.lean import auto_picks_lean
    from starpo.rollout.backends.lean_decoder import lean_config_support
    from starpo.rollout.backends.linear_kernels import onednn_applies

    device = resolve_device(cfg.model.device)
    compute = compute_dtype(cfg.model.dtype, device)
    decode = rollout_dtype(cfg.rollout.dtype, compute, device)
    backend = cfg.rollout.backend
    config = model_config if model_config is not None else SimpleNamespace(model_type=model_type)
    unsupported = lean_config_support(config, lora=cfg.model.lora.enabled)
    lean = backend == "lean" or (
        backend == "auto" and auto_picks_lean(device.type == "cpu", unsupported)
    )
    decode = decode if decode is not None else torch.float32
    packed = lean and onednn_applies(decode, device) is None
    kv_item = _dtype_bytes(resolve_dtype(cfg.rollout.kv_dtype, device))
    return Runtime(compute, decode, lean, packed, kv_item)


def _micro_tokens(
    micro: int, group_size: int, episode: EpisodeShape, config: Any
) -> tuple[int, int]:
    """(actor, critic) tokens of one training forward over `micro` trajectories padded to
    the longest episode. Rows come sorted by prompt, so a micro-batch spans
    ceil(micro / group_size) env groups. The actor encodes one group's prompt once, and
    several groups' prompts once each where `forward_plan` would pack them (a packable
    model, cheaper than the rows as they are; groups are counted as distinct prompts, the
    worst case); the critic encodes every row in full."""
    from starpo.compute.packing import groups_packing_pays

    length, prompt = episode.max_length, episode.prompt_tokens
    plain = micro * length
    # Rows of several sequences (context_window) run plain: no prefix is encoded once.
    if micro == 1 or len(episode.part_lengths) > 1:
        return plain, plain
    groups = -(-micro // group_size)
    packs = config is not None and groups_packing_pays(config, groups, micro, length, prompt)
    if groups == 1 or packs:
        return groups * prompt + micro * (length - prompt), plain
    return plain, plain


def plan_memory(
    cfg: Any, shape: ModelShape, train: EpisodeShape, val: EpisodeShape | None = None
) -> MemoryPlan:
    """The peak-memory estimate of `starpo train` with config `cfg` (see the module doc)."""
    run = runtime_for(cfg, shape.model_type, shape.config)
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
    kv_item = run.kv_item_bytes if run.lean else _dtype_bytes(run.decode_dtype)
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
    sampled = SAMPLING_MATRICES if s.top_p >= 1.0 else TOP_P_SAMPLING_MATRICES
    parts = {
        f"KV cache ({rows} {which} episodes x {episode.max_length} tokens)": kv,
        "decode logits and sampling": rows * shape.vocab * 4 * sampled,
    }
    if not run.lean:  # transformers' DynamicCache re-allocates each layer a token longer
        parts["KV cache growth (HF DynamicCache)"] = HF_CACHE_GROWTH_LAYERS * kv // shape.layers
    if not run.lean and run.decode_dtype != torch.float32 and not cfg.model.lora.enabled:
        parts["autocast weight copies"] = shape.params * _dtype_bytes(run.decode_dtype)
    return parts


def update_parts(cfg: Any, shape: ModelShape, run: Runtime, train: EpisodeShape) -> dict[str, int]:
    """The update phase: gradients and what one micro-batch's forward keeps for backward."""
    import torch

    micro = cfg.optim.micro_batch_size
    actor_tokens, critic_tokens = _micro_tokens(micro, cfg.rollout.group_size, train, shape.config)
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
    logits = micro * positions * shape.vocab * 4
    parts[f"LM-head logits kept for backward ({micro} x {positions} positions)"] = logits
    parts["their gradient in backward"] = logits
    if not cfg.model.lora.enabled:  # autograd adds a new gradient to .grad from a temporary
        parts["a gradient being accumulated (the vocabulary matrix)"] = (
            GRAD_BYTES * shape.vocab * shape.hidden
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


def trainable_parameters(cfg: Any, shape: ModelShape) -> int:
    """Parameters the optimizer updates: the policy's (or its LoRA adapters) and, with a
    critic, the critic's backbone (or adapters) and value head."""
    lora = cfg.model.lora.enabled
    actor = shape.lora_params if lora else shape.params
    if not cfg.algorithm.uses_critic:
        return actor
    return actor + (shape.lora_params if lora else shape.backbone_params) + shape.hidden + 1


def checkpoint_bytes(trainable: int, contents: str) -> int:
    """Bytes of one checkpoint of `trainable` parameters on disk: the fp32 weights, plus
    AdamW's two fp32 moments unless trainer.checkpoint_contents=weights (the measured save
    of the 135M model was within 1% of it)."""
    return (4 + ADAM_BYTES if contents == "full" else 4) * trainable


def checkpoint_size(cfg: Any, shape: ModelShape) -> int:
    """`checkpoint_bytes` of the config's model, from its shape alone."""
    return checkpoint_bytes(trainable_parameters(cfg, shape), cfg.trainer.checkpoint_contents)


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
