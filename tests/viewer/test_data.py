"""Unit tests: JSON escaping for <script>, the normaliser, and folder loading."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from starpo.errors import UserError
from starpo.types import EnvStep, Episode, Trajectory
from starpo.viewer import build_viewer, view_main
from starpo.viewer.data import (
    chart_points,
    display_model,
    finite,
    json_for_script,
    normalise_episode,
    normalise_line,
)
from starpo.viewer.html import render_page


@pytest.mark.parametrize(
    "text",
    [
        "</script><script>alert(1)</script>",
        "<!-- <script>",
        "a & b > c",
        "line\u2028sep\u2029para",
        'quote " backslash \\ tab \t',
        "ünïcödé 漢字",
    ],
)
def test_json_for_script_round_trips_and_has_no_raw_specials(text):
    value = {"k<ey>": [text, {"nested": text}]}
    encoded = json_for_script(value)
    for char in "<>&\u2028\u2029":
        assert char not in encoded
    assert json.loads(encoded) == value


def test_json_for_script_cannot_close_the_data_element(run_dir):
    page = build_viewer(run_dir).read_text(encoding="utf-8")
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert data is not None
    # The first </script> after the data tag is the data tag's own end: the hostile text
    # in the run did not end it early, and parsing the element gives the text back.
    model = json.loads(data.group(1))
    assert (
        "</script><script>window.__pwned=1</script>"
        in model["sources"][0]["episodes"][0]["turns"][0]["response"]
    )
    assert page.count("<script") == 2  # the data element and the page's own script


def test_finite_replaces_nan_and_inf():
    assert finite({"a": [float("nan"), 1.5, float("inf")], "b": "x"}) == {
        "a": [None, 1.5, None],
        "b": "x",
    }


def test_normalise_trajectory_drops_tokens_and_keeps_turns(run_dir):
    # split("\n"), not splitlines(): the hostile first line contains U+2028.
    text = (run_dir / "trajectories" / "step_000010.jsonl").read_text(encoding="utf-8")
    line = text.split("\n")[2]
    ep = normalise_line(line)
    assert ep["env_id"] == "sokoban" and ep["seed"] == 3 and ep["success"] is True
    assert len(ep["turns"]) == 3
    assert not {"token_ids", "logprobs", "loss_mask"} & set(ep)
    turn = ep["turns"][0]
    assert turn["actions"] == ["Right", "Jump"] and turn["executed"] == ["right"]
    assert turn["num_invalid"] == 1 and turn["think"].startswith("go right")
    assert turn["reward"] == pytest.approx(-0.1) and turn["env_reward"] == 0.0


def test_normalise_episode_turns_steps_into_turns():
    episode = Episode(
        env_id="bandit",
        seed=4,
        policy="solver",
        initial_observation="s0",
        steps=[
            EnvStep("a", "s1", 0.0, False, False, False, False),
            EnvStep("b", "s2", 1.0, True, False, True, True),
        ],
        success=True,
    )
    ep = normalise_episode(episode)
    assert [t["state"] for t in ep["turns"]] == ["s0", "s1"]
    assert ep["final_state"] == "s2"
    assert ep["turns"][0]["executed"] == [] and ep["turns"][0]["num_invalid"] == 1
    assert ep["turns"][1]["executed"] == ["b"] and ep["reward"] == 1.0
    assert normalise_line(episode.to_json()) == ep


def test_normalise_line_rejects_other_objects():
    with pytest.raises(ValueError):
        normalise_line('{"step": 1}')


def test_chart_points_skip_nulls_and_bools(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 0.5, "b": null, "c": true}\n\n{"step": 2, "a": 0.7}\n')
    assert chart_points(tmp_path) == {"a": [[1, 0.5], [2, 0.7]]}


def test_chart_points_follow_read_metrics_one_point_per_step(tmp_path):
    # A resume that did not cut the file repeats step 2: the page draws the later value,
    # as the report does; a line without an integer step is a counted skip, not a point.
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 2, "a": 5.0}\n'
        '{"step": 2.5, "a": 9.0}\n{"step": 3, "a": NaN}\n'
    )
    warnings: list[str] = []
    assert chart_points(tmp_path, warnings) == {"a": [[1, 1.0], [2, 5.0]]}
    assert len(warnings) == 1 and "line 4, an object without an integer 'step'" in warnings[0]


def test_load_run_sources_counts_and_cap(run_dir):
    model = display_model(run_dir, cap=2)
    labels = [s["label"] for s in model["sources"]]
    assert labels == ["train step 10", "train step 20", "val step 10"]
    first = model["sources"][0]
    assert first["total"] == 3 and len(first["episodes"]) == 2
    assert "train/bandit/success" in model["default_metrics"]
    assert "other/thing" not in model["default_metrics"]
    assert model["alerts"][0]["rule"] == "entropy_drop"
    assert model["summary"] is None


def test_load_eval_folder(eval_dir):
    model = display_model(eval_dir)
    (source,) = model["sources"]
    assert source["kind"] == "eval" and source["total"] == 2
    assert [e["policy"] for e in source["episodes"]] == ["random", "llm"]
    assert model["summary"]["success_rate"] == 0.5 and model["metrics"] == {}


def test_load_sft_folder_shows_its_replayed_examples(tmp_path):
    """`starpo sft --out DIR` writes sft_data.jsonl (Trajectory JSON): `starpo view DIR`."""
    example = Trajectory(env_id="sokoban", seed=7, group=0, token_ids=[1, 2], loss_mask=[0, 1])
    (tmp_path / "sft_data.jsonl").write_text(example.to_json() + "\n", encoding="utf-8")
    (source,) = display_model(tmp_path)["sources"]
    assert (source["kind"], source["label"], source["total"]) == ("sft", "sft", 1)
    assert source["episodes"][0]["seed"] == 7


def test_missing_trajectories_is_a_one_line_user_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(UserError) as info:
        build_viewer(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message and "trajectories" in message and "\n" not in message


def test_a_missing_folder_is_a_user_error_and_a_bad_line_a_counted_skip(run_dir, tmp_path):
    with pytest.raises(UserError):
        display_model(tmp_path / "nope")
    episode = sorted((run_dir / "trajectories").glob("*.jsonl"))[0].read_text().split("\n")[0]
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "trajectories.jsonl").write_text(f"not json\n{episode}\n")
    loaded = display_model(folder)
    assert [w for w in loaded["warnings"] if "trajectories.jsonl: skipped 1 unreadable" in w]
    assert sum(len(source["episodes"]) for source in loaded["sources"]) == 1


def test_build_viewer_default_and_explicit_out(run_dir, tmp_path):
    assert build_viewer(run_dir) == run_dir / "viewer.html"
    out = build_viewer(run_dir, out=tmp_path / "x" / "page.html")
    assert out.is_file() and "Content-Security-Policy" in out.read_text()


def test_page_has_no_remote_loads():
    page = render_page({"run": "r<x>", "cap": 1, "sources": [], "metrics": {}, "alerts": []})
    assert "default-src 'none'" in page and "unsafe-inline" not in page
    assert "r&lt;x&gt;" in page
    assert not re.search(r"(src|href)=\"?https?:", page)


def test_view_main_prints_the_page_path(run_dir, capsys):
    assert view_main(str(run_dir), serve=False, port=0) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "viewer.html")


def test_view_main_serves_until_ctrl_c(run_dir):
    command = [
        sys.executable,
        "-c",
        # A shell runs background jobs (`make test &`) with SIGINT ignored, and children
        # inherit that: give the server the terminal's Ctrl-C back.
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from starpo.viewer import view_main; sys.exit(view_main(sys.argv[1], True, 0))",
        str(run_dir),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    # readline() has no timeout: a watchdog kills a hung server so the test cannot hang.
    watchdog = threading.Timer(30, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout.readline().strip().endswith("viewer.html")
        line = proc.stdout.readline()  # the process prints this right after binding
        url = line.split()[1]
        assert line.startswith("serving http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert b'id="data"' in reply.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _crash(run_dir):
    """Cut the last line of metrics.jsonl, alerts.jsonl and one step file in half."""
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 21, "train/bandit/succ')
    with open(run_dir / "alerts.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 21, "state": "warn')
    with open(run_dir / "trajectories" / "step_000020.jsonl", "a", encoding="utf-8") as f:
        f.write('{"env_id": "bandit", "turns": [')


def test_half_written_last_lines_render_and_are_reported(run_dir, capsys):
    _crash(run_dir)
    model = display_model(run_dir)
    assert len(model["metrics"]["train/bandit/success"]) == 21  # steps 0..20, not 21
    assert [a["step"] for a in model["alerts"]] == [12]
    step20 = next(s for s in model["sources"] if s["label"] == "train step 20")
    assert step20["total"] == 2 and len(step20["episodes"]) == 2
    warnings = model["warnings"]
    assert len(warnings) == 3 and all("half-written last line" in w for w in warnings)
    assert any("metrics.jsonl" in w for w in warnings)
    page = build_viewer(run_dir).read_text(encoding="utf-8")
    assert 'id="warnings"' in page and "half-written" in page
    err = capsys.readouterr().err
    assert err.count("warning: ") == 3 and "metrics.jsonl" in err and "Traceback" not in err


def test_clean_folder_has_no_warnings(run_dir, capsys):
    assert display_model(run_dir)["warnings"] == []
    build_viewer(run_dir)
    assert capsys.readouterr().err == ""


def test_bad_bytes_in_run_files_are_replaced_and_the_page_still_builds(run_dir):
    with open(run_dir / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 21, "x": "\xff"}\n{"step": 22}\n')
    trajectories = sorted((run_dir / "trajectories").glob("*.jsonl"))[0]
    first, rest = trajectories.read_bytes().split(b"\n", 1)
    assert b'"play"' in first
    trajectories.write_bytes(first.replace(b'"play"', b'"pl\xffay"', 1) + b"\n" + rest)
    loaded = display_model(run_dir)  # used to die with a raw UnicodeDecodeError
    replaced = [w for w in loaded["warnings"] if "replaced bytes that are not UTF-8" in w]
    assert len(replaced) == 2  # one warning per file: metrics.jsonl and the trajectories
    assert build_viewer(run_dir).is_file()


def test_page_assets_are_package_files_hashed_in_the_csp():
    from importlib.resources import files

    from starpo.viewer.assets import CSS, JS
    from starpo.viewer.html import _sha256, content_security_policy

    static = files("starpo.viewer") / "static"
    assert JS == (static / "viewer.js").read_text(encoding="utf-8") and "use strict" in JS
    assert CSS == (static / "viewer.css").read_text(encoding="utf-8") and ".chart" in CSS
    csp = content_security_policy()
    assert _sha256(JS) in csp and _sha256(CSS) in csp
    page = render_page({"run": "r", "cap": 1, "sources": [], "metrics": {}, "alerts": []})
    assert f"<script>{JS}</script>" in page and f"<style>{CSS}</style>" in page
