"""`starpo export`: a kept checkpoint's policy becomes a model folder that holds exactly
the weights the trainer had at that step (the newest one: its final/), with or without
LoRA; bad sources are one-line errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from starpo import cli
from starpo.config import load_config
from starpo.errors import UserError
from starpo.trainer.checkpoints.export import export_checkpoint, find_checkpoint
from starpo.trainer.loop import Trainer


def _train(run: Path, model_dir: Path, *extra: str) -> None:
    cfg = load_config(
        "cpu-tiny-smoke",
        [
            f"model.name={model_dir}",
            "trainer.total_steps=2",
            "trainer.save_every=1",
            "trainer.keep_checkpoints=1",
            "trainer.keep_every=1",  # and every step for good: both kept
            "trainer.val_every=0",
            *extra,
        ],
    )
    Trainer(cfg, run, quiet=True).train()


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_each_kept_step_exports_the_weights_it_had(tmp_path, tiny_model_dir, lora):
    run = tmp_path / "run"
    extra = ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"] if lora else []
    _train(run, tiny_model_dir, *extra)
    # The newest checkpoint is step 2, the end of training: the same weights as final/.
    assert cli.main(["export", str(run), "--out", str(tmp_path / "newest")]) == 0
    final = load_file(run / "final" / "model.safetensors")
    newest = load_file(tmp_path / "newest" / "model.safetensors")
    assert _same(newest, final)
    assert (tmp_path / "newest" / "tokenizer.json").is_file()
    # Step 1, named by --step or by its folder, is another model: one update earlier.
    assert cli.main(["export", str(run), "--step", "1", "--out", str(tmp_path / "one")]) == 0
    folder = run / "checkpoints" / "step_000001"
    assert cli.main(["export", str(folder), "--out", str(tmp_path / "one-again")]) == 0
    one = load_file(tmp_path / "one" / "model.safetensors")
    assert _same(one, load_file(tmp_path / "one-again" / "model.safetensors"))
    assert not _same(one, final)
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert not _same({k: one[k] for k in initial}, initial)  # step 1 did update it
    # The exported folder is an ordinary model: the trainer takes it as model.name.
    assert not any(k.startswith("base_model") or "lora" in k for k in one)


@pytest.mark.slow
def test_bad_sources_are_one_line_errors(tmp_path, tiny_model_dir, capsys):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    run = tmp_path / "run"
    _train(run, base)
    base.rename(tmp_path / "moved")  # the run's recorded model.name no longer resolves
    cases = [
        ([str(tmp_path / "nope")], "does not exist"),
        ([str(tiny_model_dir)], "holds no checkpoints"),
        ([str(run), "--step", "7"], "keeps no checkpoint of step 7 (it keeps step 1, 2"),
        ([str(run / "checkpoints" / "step_000002"), "--step", "1"], "not 1: drop --step"),
        ([str(run)], "recorded model.name: give --base"),
        ([str(run), "--base", str(tmp_path / "nope")], "does not exist"),
    ]
    for args, fragment in cases:
        capsys.readouterr()
        assert cli.main(["export", *args, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists()  # nothing half-written
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty"):
        export_checkpoint(find_checkpoint(run), tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"  # untouched
    assert find_checkpoint(run).name == "step_000002"
    moved = ["export", str(run), "--base", str(tmp_path / "moved"), "--out", str(tmp_path / "out")]
    assert cli.main(moved) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
