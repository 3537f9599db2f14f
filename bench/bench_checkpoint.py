"""What a checkpoint costs the training step, for each way of writing it, side by side.

    python bench/bench_checkpoint.py [--size-mb 500] [--repeats 3] [--dir /tmp]

A synthetic trainer state of about `--size-mb` MB (324 MB at least), shaped like the 135M
model's: fp32 weights (an embedding of 49152 x 576 and 576 x 1536 matrices) and AdamW's two
moments of the same size (2/3 of a full checkpoint; 1540 MB is the 135M model's). Every
contender writes it with the real atomic protocol (`save_checkpoint`: temp folder, fsync,
meta.json with the SHA-256, rename), keeping one checkpoint, the way `Trainer.save` does:

- sync, before: the weights copied, state.pt written, then read back for its SHA-256
  (`Trainer.save` before this bench);
- sync, + hash as written: the SHA-256 computed from the bytes as torch.save writes them;
- sync, + weights not copied: the live tensors written (the write ends before the next
  update), as `Trainer.save` does now;
- async: `trainer.checkpoint_async`; the step is blocked only for the snapshot (weights
  and moments copied to host memory), the write runs in a background thread. The first
  save allocates the snapshot's memory, later ones reuse it (shown apart). Also printed:
  how much slower a step's worth of matmuls runs while the write is in flight;
- weights only: `trainer.checkpoint_contents=weights`, written synchronously.

Each round runs every contender once (the synchronous ones in rotating order), each after
an os.sync() so that none pays for another's dirty pages. Blocked = seconds the training
step waits: the best and the median of `--repeats` rounds, and the ratio of the bests to
the first contender's (on a shared machine the best is the cost least disturbed by other
jobs; the median shows how much they disturb).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from starpo.trainer.checkpoints import store as checkpoint
from starpo.trainer.checkpoints.saver import CheckpointSaver, Target
from starpo.trainer.checkpoints.store import checkpoint_bytes


def rereading_write_folder(folder: Path, step: int, state: dict) -> None:
    """`_write_folder` as it was: write state.pt, then read it back for its SHA-256."""
    import json

    folder.mkdir(parents=True)
    state_path = folder / checkpoint.STATE_FILE
    with open(state_path, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    meta = {
        "step": step,
        "format": checkpoint.FORMAT,
        "files": {checkpoint.STATE_FILE: state_path.stat().st_size},
        "sha256": {checkpoint.STATE_FILE: checkpoint._sha256(state_path)},
    }
    with open(folder / checkpoint.META_FILE, "w", encoding="utf-8") as file:
        json.dump(meta, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    checkpoint._fsync_dir(folder)


def synthetic_weights(size_mb: float) -> dict[str, torch.Tensor]:
    """fp32 tensors of about size_mb / 3 MB, shaped like a small Llama's."""
    weights = {"embed_tokens.weight": torch.randn(49152, 576)}
    budget = size_mb / 3 * 2**20 - weights["embed_tokens.weight"].numel() * 4
    for i in range(max(0, round(budget / (576 * 1536 * 4)))):
        weights[f"layers.{i}.mlp.weight"] = torch.randn(576, 1536)
    return weights


def matmul_work(repeats: int = 40) -> float:
    """Seconds of a fixed amount of fp32 matmuls (a stand-in for a training step)."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=500.0, help="full checkpoint size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()

    weights = synthetic_weights(args.size_mb)
    moments = {
        "state": {
            i: {"step": torch.tensor(7.0), "exp_avg": torch.randn_like(w), "exp_avg_sq": w.abs()}
            for i, w in enumerate(weights.values())
        },
        "param_groups": [{"lr": 1e-6, "betas": (0.9, 0.999), "params": list(range(len(weights)))}],
    }

    def copied_weights_state(step: int) -> dict:  # Trainer.checkpoint_state before: weights
        return {"step": step, "actor": {k: v.clone() for k, v in weights.items()}, "optim": moments}

    def full_state(step: int) -> dict:  # as Trainer.checkpoint_state now: all live
        return {"step": step, "actor": weights, "optim": moments}

    def weights_state(step: int) -> dict:
        return {"step": step, "actor": weights, "optim": None}

    root = Path(tempfile.mkdtemp(prefix="starpo-bench-ckpt-", dir=args.dir))
    new_write_folder = checkpoint._write_folder
    quiet = lambda line: None  # noqa: E731
    rows: dict[str, dict[str, list[float]]] = {}

    def record(name: str, **values: float) -> None:
        for key, value in values.items():
            rows.setdefault(name, {}).setdefault(key, []).append(value)

    def sync_save(name: str, build_state, folder: str) -> None:
        os.sync()  # no earlier contender's dirty pages left to flush on this one's time
        saver = CheckpointSaver(background=False, say=quiet)
        started = time.perf_counter()
        path = saver.save(1, build_state, [Target(root / folder, keep=1)])
        record(name, blocked=time.perf_counter() - started, mb=checkpoint_bytes(path) / 2**20)

    sync_contenders = [  # (name, how state.pt is hashed, the state, folder)
        ("sync, before", rereading_write_folder, copied_weights_state, "before"),
        ("sync, + hash as written", new_write_folder, copied_weights_state, "hashing"),
        ("sync, + weights not copied", new_write_folder, full_state, "now"),
    ]
    background = CheckpointSaver(background=True, say=quiet)  # one per run, as in a Trainer

    def async_save(name: str) -> None:
        alone = matmul_work()  # the same work without a write, just before
        os.sync()
        started = time.perf_counter()
        background.save(1, full_state, [Target(root / "async", keep=1)])
        blocked = time.perf_counter() - started
        during = matmul_work()  # the next step's work, while the write is in flight
        background.wait()
        cost = background.take_cost()
        record(
            name,
            blocked=blocked,
            mb=cost["perf/checkpoint_mb"],
            write=cost["perf/checkpoint_write_s"],
            alone=alone,
            slowdown=during - alone,
        )

    try:
        async_save("async (first save)")  # allocates the snapshot's memory
        for round_ in range(args.repeats):
            turn = round_ % len(sync_contenders)  # each goes first in turn
            for name, write_folder, build_state, folder in (
                sync_contenders[turn:] + sync_contenders[:turn]
            ):
                checkpoint._write_folder = write_folder
                sync_save(name, build_state, folder)
            checkpoint._write_folder = new_write_folder
            async_save("async (later saves)")
            sync_save("weights only (sync)", weights_state, "weights")
    finally:
        checkpoint._write_folder = new_write_folder
        shutil.rmtree(root, ignore_errors=True)

    print(f"checkpoint cost, {args.size_mb:.0f} MB full state, {args.repeats} rounds,")
    print(f"{torch.get_num_threads()} torch threads; written under {root.parent}")
    print("blocked = seconds the step waits: best and median of the rounds, ratio of the bests")
    print(f"{'contender':<28}{'MB':>8} {'best s':>7} {'median s':>9} {'ratio':>6} {'write s':>8}")
    base = min(rows["sync, before"]["blocked"])
    order = [c[0] for c in sync_contenders] + [n for n in rows if not n.startswith("sync")]
    for name in order:
        values = rows[name]
        best, median = min(values["blocked"]), statistics.median(values["blocked"])
        write = f"{statistics.median(values['write']):8.2f}" if "write" in values else ""
        print(
            f"{name:<28}{statistics.median(values['mb']):8.1f} {best:7.2f} {median:9.2f} "
            f"{best / base:6.2f} {write}"
        )
    alone = statistics.median(rows["async (later saves)"]["alone"])
    slowdown = statistics.median(rows["async (later saves)"]["slowdown"])
    print(
        f"a step's matmuls alone: {alone:.2f} s; started with the async write: "
        f"{slowdown:+.2f} s (what the background write takes from the step)"
    )


if __name__ == "__main__":
    main()
