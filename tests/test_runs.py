"""starpo.runs: the run-folder names and the one JSONL reader every caller shares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from starpo import runs
from starpo.diagnostics import AlertLog
from starpo.errors import UserError
from starpo.runs import load_jsonl, read_jsonl

GOOD = '{"step": 1, "x": 0.5}\n{"step": 2, "x": 0.7}\n'


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_truncated_last_line_is_skipped_with_a_count(tmp_path):
    path = _write(tmp_path / "m.jsonl", (GOOD + '{"step": 3, "x"').encode())
    read = read_jsonl(path)
    assert [r["step"] for r in read.records] == [1, 2] and read.numbers == [1, 2]
    assert [(s.number, s.torn) for s in read.skipped] == [(3, True)]
    assert "half-written last line" in read.warning() and str(path) in read.warning()
    assert load_jsonl(path).records == read.records  # the package's rule tolerates it too


def test_corrupt_middle_line_is_skipped_with_a_count(tmp_path):
    path = _write(tmp_path / "m.jsonl", b'{"step": 1}\n{oops\n[1, 2]\n{"step": 4}\n')
    read = read_jsonl(path)  # nothing raised
    assert [r["step"] for r in read.records] == [1, 4] and read.total == 2
    assert [(s.number, s.torn) for s in read.skipped] == [(2, False), (3, False)]
    assert read.skipped[0].reason.startswith("not valid JSON")
    assert read.skipped[1].reason == "not a JSON object"
    assert "skipped 2 unreadable line(s)" in read.warning()


def test_bytes_that_are_not_utf8_are_replaced_and_counted_not_fatal(tmp_path):
    path = _write(
        tmp_path / "m.jsonl", b'{"step": 1}\n{"step": 2, "x": "a\xff\xfeb"}\n{"step": 3}\n'
    )
    read = load_jsonl(path)  # the strict reader too: bad bytes never stop a reader
    assert [r["step"] for r in read.records] == [1, 2, 3] and not read.skipped
    assert read.records[1]["x"] == "a\ufffd\ufffdb"
    assert read.replaced == [2]
    warning = read.warning()
    assert "replaced bytes that are not UTF-8 with U+FFFD in 1 line(s) (first: line 2)" in warning
    assert "\n" not in warning  # one warning line per file


def test_load_jsonl_names_a_broken_inner_line_instead_of_a_traceback(tmp_path):
    path = _write(tmp_path / "metrics.jsonl", b'{"step": 1}\n\xff\n{"step": 3}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:2 is not valid JSON"):
        load_jsonl(path)
    read = load_jsonl(path, skip_broken=True)  # the viewer and the report: skip and count
    assert [r["step"] for r in read.records] == [1, 3]
    assert "skipped 1 unreadable line(s) (first: line 2" in read.warning()


def test_missing_file_blank_lines_and_line_separators(tmp_path):
    assert read_jsonl(tmp_path / "nope.jsonl").records == []
    # U+2028 is a line break for str.splitlines(), not for JSONL.
    record = {"step": 1, "message": "a\u2028b\rc"}
    path = _write(tmp_path / "m.jsonl", ("\n" + runs.json_line(record) + "  \n").encode())
    read = read_jsonl(path)
    assert read.records == [record] and read.numbers == [2] and not read.skipped


def test_limit_counts_but_does_not_parse_the_rest(tmp_path):
    path = _write(tmp_path / "m.jsonl", b'{"step": 1}\n{"step": 2}\n{broken\n{"step": 4}\n')
    read = read_jsonl(path, limit=2)
    assert [r["step"] for r in read.records] == [1, 2] and read.total == 4
    assert read.skipped == []


def test_append_and_atomic_rewrite(tmp_path):
    path = tmp_path / "sub" / "a.jsonl"
    runs.append_jsonl(path, [{"step": 1, "m": "ü"}])
    runs.append_jsonl(path, [{"step": 2}, {"step": 3}])
    assert path.read_text(encoding="utf-8") == '{"step": 1, "m": "ü"}\n{"step": 2}\n{"step": 3}\n'
    runs.rewrite_jsonl(path, (r for r in read_jsonl(path).records if r["step"] != 2))
    assert [r["step"] for r in read_jsonl(path).records] == [1, 3]
    assert not path.with_name("a.jsonl.tmp").exists()
    with pytest.raises(ValueError):
        runs.json_line({"x": float("nan")}, allow_nan=False)


def test_layout_names_and_step_files(tmp_path):
    folder = runs.RunFolder(tmp_path)
    assert folder.metrics == tmp_path / "metrics.jsonl"
    assert folder.alerts == tmp_path / "alerts.jsonl"
    assert folder.config == tmp_path / "config.yaml"
    assert folder.checkpoints == tmp_path / "checkpoints"
    assert (folder.healthy, folder.final) == (tmp_path / "healthy", tmp_path / "final")
    assert runs.step_file(folder.trajectories, 10) == tmp_path / "trajectories/step_000010.jsonl"
    folder.trajectories.mkdir()
    for name in ("step_000020.jsonl", "step_000003.jsonl", "step_000004.jsonl.tmp", "x.jsonl"):
        (folder.trajectories / name).write_text("")
    assert [s for s, _ in runs.step_files(folder.trajectories)] == [3, 20]
    for name in ("step_000002", "step_000011", ".tmp-step_000012-99"):
        (folder.checkpoints / name).mkdir(parents=True)
    assert [s for s, _ in runs.step_dirs(folder.checkpoints)] == [2, 11]
    assert runs.step_files(tmp_path / "missing") == []


def test_alert_log_skips_a_torn_last_line_and_drops_it_on_truncate(tmp_path, capsys):
    path = tmp_path / "alerts.jsonl"
    path.write_text('{"step": 1, "rule": "a"}\n{"step": 5, "rule": "b"}\n{"step": 6, "ru')
    log = AlertLog(tmp_path)
    assert [r["step"] for r in log.read()] == [1, 5]
    log.truncate_after(4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1]
    assert "half-written last line" in capsys.readouterr().err


def test_alert_log_broken_inner_line_is_a_user_error(tmp_path):
    (tmp_path / "alerts.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(UserError, match="alerts.jsonl:2"):
        AlertLog(tmp_path).read()


def test_runs_is_torch_free():
    code = "import sys, starpo.runs; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
