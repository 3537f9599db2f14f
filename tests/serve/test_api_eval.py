"""`starpo eval --policy api`: against `starpo serve` over a tiny random model (episode for
episode equal to the in-process engine) and against a small fake server on 127.0.0.1
(retries, failures, --resume, the key). Every wait is bounded."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from serving import WAIT_S, free_port, running  # noqa: E402

from starpo.cli import main  # noqa: E402
from starpo.config.episode import EpisodeSettings  # noqa: E402
from starpo.evaluation.api import ApiPlayer, make_client  # noqa: E402
from starpo.rollout.backends.hf import HFBackend  # noqa: E402
from starpo.rollout.engine import RolloutEngine  # noqa: E402
from starpo.serve.app import build_app  # noqa: E402

NAME = "tiny-policy"
KEY = "sk-test-secret-4242"


@pytest.fixture(scope="module")
def served(tiny):
    """`starpo serve`'s app over the tiny model, in a thread: its base URL."""
    model, tokenizer = tiny
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id)
    app = build_app(backend, tokenizer, NAME, context_length=2048, max_batch=1)
    with running(app) as url:
        yield url + "/v1"


def comparable(trajectories):
    return [
        (
            t.seed,
            [(turn.response, turn.actions, turn.executed, turn.reward) for turn in t.turns],
            t.env_reward,
            t.success,
            t.done,
            t.error,
        )
        for t in trajectories
    ]


@pytest.mark.parametrize(
    ("env_id", "think", "max_turns"), [("bandit", True, 1), ("sokoban", False, 3)]
)
def test_api_episodes_equal_the_engines_greedy_episodes(served, tiny, env_id, think, max_turns):
    model, tokenizer = tiny
    settings = EpisodeSettings(
        think=think, max_turns=max_turns, max_new_tokens=12, temperature=0.0, top_p=1.0
    )
    seeds = [0, 1, 2]
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id)
    engine = RolloutEngine(backend, tokenizer, settings)
    local = engine.run(env_id, seeds, 1)
    client = make_client(served, "none", timeout_s=WAIT_S, max_retries=0)
    remote = ApiPlayer(client, NAME, settings, concurrency=2, prefill=True).run(env_id, seeds, 1)
    assert comparable(remote) == comparable(local)
    assert [t.messages for t in remote] == [t.messages for t in local]
    for t in remote:
        assert t.token_ids == [] and t.usage["requests"] == len(t.turns)
        assert t.usage["completion_tokens"] > 0 and t.wall_s > 0


def test_cli_eval_api_writes_summary_and_defaults_to_the_served_model(served, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "--env", "bandit", "--policy", "api", "--base-url", served]
    args += ["--episodes", "2", "--max-turns", "1", "--max-new-tokens", "4", "--out", str(out)]
    args += ["--quiet"]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == NAME and summary["num_episodes"] == 2
    assert summary["requests"] == 2 and summary["completion_tokens"] > 0
    assert summary["api_errors"] == 0 and summary["wall_s"] > 0
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert [json.loads(line)["seed"] for line in lines] == [
        summary["seed_start"],
        summary["seed_start"] + 1,
    ]


class FakeApi(BaseHTTPRequestHandler):
    """GET /v1/models and POST /v1/chat/completions; `self.server.state` scripts them."""

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        state = self.server.state
        state["auth"].append(self.headers.get("Authorization"))
        if state.get("status_models"):
            self._send(state["status_models"], {"error": {"message": "no"}})
            return
        self._send(200, {"object": "list", "data": [{"id": m} for m in state["models"]]})

    def do_POST(self):  # noqa: N802
        state = self.server.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with state["lock"]:
            state["auth"].append(self.headers.get("Authorization"))
            state["requests"] += 1
            state.setdefault("bodies", []).append(body)
            fail = state["fail"] > 0
            state["fail"] -= 1
            replies = state["reply"]  # one reply, or a list: request i gets item i
            reply = replies if isinstance(replies, (str, dict)) else replies[state["requests"] - 1]
        if fail:
            self._send(500, {"error": {"message": "overloaded", "type": "server_error"}})
            return
        # A reply is text, or a message's fields (native tool calls: {"tool_calls": [...]}).
        fields = reply if isinstance(reply, dict) else {"content": reply}
        message = {"role": "assistant", "content": None, **fields}
        self._send(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
            },
        )


@pytest.fixture
def fake():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    server.state = {
        "models": ["m1"],
        "fail": 0,
        "requests": 0,
        "auth": [],
        "lock": threading.Lock(),
        "reply": "<think>go</think><answer>Phoenix</answer>",
    }
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield server
    server.shutdown()
    thread.join(WAIT_S)
    server.server_close()


def run_eval(fake, out: Path, *extra: str) -> int:
    url = f"http://127.0.0.1:{fake.server_address[1]}/v1"
    args = ["eval", "--env", "bandit", "--policy", "api", "--base-url", url, "--out", str(out)]
    return main([*args, "--quiet", "--request-timeout", "5", *extra])


def test_500s_are_retried_then_the_episode_plays(fake, tmp_path):
    fake.state["fail"] = 2
    assert run_eval(fake, tmp_path / "o", "--episodes", "1", "--max-retries", "3") == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert fake.state["requests"] == 3
    assert summary["api_errors"] == 0 and summary["valid_action_rate"] == 1.0


def test_a_failing_server_records_errors_and_the_run_goes_on(fake, tmp_path, capsys):
    fake.state["fail"] = 10**6
    args = ("--episodes", "3", "--max-retries", "0", "--concurrency", "2")
    assert run_eval(fake, tmp_path / "o", *args) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["num_episodes"] == 3 and summary["api_errors"] == 3
    assert summary["env_errors"] == 0 and fake.state["requests"] == 3
    lines = (tmp_path / "o" / "trajectories.jsonl").read_text().splitlines()
    assert all(json.loads(line)["error"].startswith("api: InternalServerError") for line in lines)
    assert "3 failed episodes" in capsys.readouterr().out


def test_resume_plays_only_the_missing_episodes(fake, tmp_path):
    out = tmp_path / "o"
    assert run_eval(fake, out, "--episodes", "2") == 0
    assert fake.state["requests"] == 2
    path = out / "trajectories.jsonl"
    path.write_text(path.read_text() + '{"cut": ')  # an interrupted write
    assert run_eval(fake, out, "--episodes", "4", "--resume") == 0
    assert fake.state["requests"] == 4  # seeds 3 and 4 only
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_episodes"] == 4 and summary["resumed_episodes"] == 2
    assert summary["requests"] == 4 and summary["success"] >= 0
    seeds = [json.loads(line)["seed"] for line in path.read_text().splitlines()]
    assert seeds == sorted(set(seeds)) and len(seeds) == 4


def test_the_key_comes_from_the_env_var_and_is_never_written(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MY_KEY", KEY)
    assert run_eval(fake, tmp_path / "o", "--episodes", "1", "--api-key-env", "MY_KEY") == 0
    assert set(fake.state["auth"]) == {f"Bearer {KEY}"}
    written = "".join(p.read_text() for p in (tmp_path / "o").iterdir())
    shown = capsys.readouterr()
    assert KEY not in written + shown.out + shown.err


def test_without_the_env_var_the_key_is_none(fake, tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    assert (
        run_eval(fake, tmp_path / "o", "--episodes", "1", "--api-key-env", "NO_SUCH_KEY_VAR") == 0
    )
    assert set(fake.state["auth"]) == {"Bearer none"}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_model_choice_errors_are_one_line(fake, tmp_path, capsys):
    fake.state["models"] = ["a", "b"]
    assert run_eval(fake, tmp_path / "o", "--episodes", "1") != 0
    assert "lists 2 models (a, b): pick one with --api-model" in one_error_line(capsys)
    assert run_eval(fake, tmp_path / "o", "--episodes", "1", "--api-model", "c") != 0
    assert "no model 'c'; it lists: a, b" in one_error_line(capsys)
    assert fake.state["requests"] == 0


def test_bad_key_and_unreachable_url_fail_before_any_episode(fake, tmp_path, capsys):
    fake.state["status_models"] = 401
    assert run_eval(fake, tmp_path / "o", "--episodes", "1", "--max-retries", "0") != 0
    assert "refused the API key (401): export the right key as OPENAI_API_KEY" in one_error_line(
        capsys
    )
    assert fake.state["requests"] == 0
    port = free_port()  # nothing listens there
    args = ["eval", "--env", "bandit", "--policy", "api", "--out", str(tmp_path / "p")]
    args += ["--base-url", f"http://127.0.0.1:{port}/v1", "--max-retries", "0"]
    assert main([*args, "--quiet", "--request-timeout", "5"]) != 0
    assert f"cannot reach http://127.0.0.1:{port}/v1" in one_error_line(capsys)


def test_serve_refuses_a_continuation_without_a_final_assistant_message(served):
    import urllib.error
    import urllib.request

    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": "hi"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    request = urllib.request.Request(
        f"{served}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=WAIT_S)
    assert info.value.code == 400
    assert json.loads(info.value.read())["error"]["param"] == "continue_final_message"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--api-model", "m2"), "model"),
        (("--max-new-tokens", "64"), "settings"),
        (("--api-prefill",), "api_prefill"),
        (("--env-arg", "high_risk_prob=0.5"), "env_kwargs"),
    ],
)
def test_resume_refuses_episodes_played_with_other_settings(fake, tmp_path, capsys, flags, named):
    fake.state["models"] = ["m1", "m2"]
    out = tmp_path / "o"
    assert run_eval(fake, out, "--episodes", "1", "--api-model", "m1") == 0
    before = (out / "trajectories.jsonl").read_text()
    args = ("--episodes", "2", "--resume", "--api-model", "m1", *flags)
    assert run_eval(fake, out, *args) == 2
    err = capsys.readouterr().err
    assert f"played with another {named}" in err and "use a new --out" in err
    assert (out / "trajectories.jsonl").read_text() == before  # nothing lost
    assert fake.state["requests"] == 1  # nothing played


def test_resume_refuses_a_folder_without_its_record(fake, tmp_path, capsys):
    out = tmp_path / "o"
    assert run_eval(fake, out, "--episodes", "1") == 0
    (out / "eval_run.json").unlink()
    assert run_eval(fake, out, "--episodes", "2", "--resume") == 2
    assert "has episodes but no eval_run.json" in capsys.readouterr().err


def test_samples_per_seed_give_pass_at_k_and_resume_tops_up_each_seed(fake, tmp_path):
    """One request at a time: the first run's two seeds get Dragon (wins) and Phoenix, the
    resumed run's second samples Phoenix and Dragon: each seed has one win in two."""
    dragon, phoenix = (f"<think>go</think><answer>{arm}</answer>" for arm in ("Dragon", "Phoenix"))
    fake.state["reply"] = [dragon, phoenix, phoenix, dragon]
    out = tmp_path / "o"
    flags = ("--env-arg", "high_risk_prob=1.0", "--concurrency", "1", "--samples-per-seed")
    assert run_eval(fake, out, "--episodes", "2", *flags, "1") == 0
    assert run_eval(fake, out, "--episodes", "2", *flags, "2", "--resume") == 0
    assert fake.state["requests"] == 4  # 2 kept, 2 played: one more sample a seed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_episodes"] == 4 and summary["samples_per_seed"] == 2
    assert summary["pass@1"] == 0.5 and summary["pass@2"] == 1.0
    seeds = [
        json.loads(line)["seed"] for line in (out / "trajectories.jsonl").read_text().splitlines()
    ]
    assert sorted(seeds) == [seeds[0], seeds[0], seeds[0] + 1, seeds[0] + 1]


def test_a_tool_env_is_played_with_the_apis_own_function_calling(fake, tmp_path):
    from starpo.envs import make

    env = make("invoice")
    env.reset(seed=123)  # the eval's first seed
    replies = []
    while not env.done:
        call = json.loads(env.optimal_action())
        native = {
            "id": f"call_{len(replies)}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
        }
        replies.append({"content": "checking", "tool_calls": [native]})
        env.step(env.optimal_action())
    fake.state["reply"] = replies
    url = f"http://127.0.0.1:{fake.server_address[1]}/v1"
    out = tmp_path / "o"
    args = ["eval", "--env", "invoice", "--policy", "api", "--base-url", url, "--out", str(out)]
    assert main([*args, "--quiet", "--episodes", "1", "--max-turns", "8"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success"] == 1.0 and summary["tool_call_valid"] == 1.0
    bodies = fake.state["bodies"]
    assert all(b["tools"] == type(env).tool_schemas() for b in bodies)
    last = bodies[-1]["messages"]
    assert "<tools>" not in last[0]["content"]  # the tools travel as the request's tools
    answered = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert answered == [f"call_{i}" for i in range(len(replies) - 1)]
    asked = [m["tool_calls"][0]["id"] for m in last if m["role"] == "assistant"]
    assert asked == answered
    (traj,) = [json.loads(line) for line in (out / "trajectories.jsonl").open()]
    assert traj["turns"][0]["response"].startswith("<think>checking</think><tool_call>")


def test_native_calls_with_broken_arguments_are_refused_with_a_reason(fake, tmp_path):
    broken = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_tax_rate", "arguments": "{"},
    }
    fake.state["reply"] = {"content": "", "tool_calls": [broken]}
    url = f"http://127.0.0.1:{fake.server_address[1]}/v1"
    out = tmp_path / "o"
    args = ["eval", "--env", "invoice", "--policy", "api", "--base-url", url, "--out", str(out)]
    assert main([*args, "--quiet", "--episodes", "1", "--max-turns", "2"]) == 0
    (traj,) = [json.loads(line) for line in (out / "trajectories.jsonl").open()]
    assert traj["turns"][0]["tool_results"] == [
        "Error: get_tax_rate: arguments are not a JSON object"
    ]
    second = fake.state["bodies"][1]["messages"]
    assert second[-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "Error: get_tax_rate: arguments are not a JSON object",
    }
