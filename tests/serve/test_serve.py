"""`starpo serve`: the OpenAI-compatible app over a tiny random model, driven by the
official openai client and raw HTTP; the server runs in a thread on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from serving import WAIT_S, running  # noqa: E402

from starpo.rollout.backends.base import GenerationRequest, SamplingParams  # noqa: E402
from starpo.rollout.backends.hf import HFBackend  # noqa: E402
from starpo.serve.app import build_app  # noqa: E402

NAME = "tiny-policy"
CONTEXT = 256


class CountingBackend:
    """An HFBackend that counts generate calls and the largest batch."""

    def __init__(self, inner: HFBackend):
        self.inner = inner
        self.numerics = inner.numerics
        self.calls = 0
        self.largest = 0

    def generate(self, requests, params):
        self.calls += 1
        self.largest = max(self.largest, len(requests))
        time.sleep(0.05)  # a slower model: later requests queue up meanwhile
        return self.inner.generate(requests, params)

    def seed(self, seed):
        self.inner.seed(seed)

    def reset(self):
        self.inner.reset()

    def release(self, sessions):
        self.inner.release(sessions)

    def update_weights(self, model, version):
        pass


@pytest.fixture(scope="module")
def server(tiny):
    model, tokenizer = tiny
    backend = CountingBackend(HFBackend(model, pad_token_id=tokenizer.pad_token_id))
    app = build_app(backend, tokenizer, NAME, context_length=CONTEXT, max_batch=8)
    with running(app) as url:
        yield url, backend


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)


def ask(client, text: str = "Say hi.", **kwargs):
    kwargs.setdefault("max_tokens", 12)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": text}], **kwargs
    )


def direct(tiny, text: str, max_tokens: int) -> list[int]:
    """What a fresh backend generates greedily for the chat-template prompt."""
    from starpo.models import stop_token_ids

    model, tokenizer = tiny
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id)
    params = SamplingParams(max_tokens, 0.0, 1.0, tuple(stop_token_ids(tokenizer)))
    return backend.generate([GenerationRequest(0, ids)], params)[0].token_ids


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == [NAME]


def test_greedy_reply_is_what_the_backend_generates(client, tiny):
    tokenizer = tiny[1]
    reply = ask(client, max_tokens=10)
    expected = direct(tiny, "Say hi.", 10)
    assert reply.choices[0].message.content == tokenizer.decode(expected, skip_special_tokens=True)
    assert reply.choices[0].message.role == "assistant"
    assert reply.model == NAME


def test_usage_counts_prompt_and_completion_tokens(client, tiny):
    tokenizer = tiny[1]
    reply = ask(client, max_tokens=7)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], tokenize=False, add_generation_prompt=True
    )
    prompt_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert reply.usage.prompt_tokens == prompt_tokens
    assert reply.usage.completion_tokens == len(direct(tiny, "Say hi.", 7))
    assert reply.usage.total_tokens == prompt_tokens + reply.usage.completion_tokens


def test_max_tokens_ends_with_length(client):
    for kwargs in ({"max_tokens": 3}, {"max_tokens": None, "max_completion_tokens": 3}):
        reply = ask(client, **kwargs)
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.completion_tokens == 3


def test_stream_chunks_join_to_the_plain_reply(client):
    plain = ask(client, max_tokens=12).choices[0].message.content
    stream = ask(client, max_tokens=12, stream=True, stream_options={"include_usage": True})
    pieces, finishes, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finishes.append(choice.finish_reason)
    assert "".join(pieces) == plain
    assert finishes[-1] == "length" and len(pieces) > 2
    assert usage is not None and usage.completion_tokens == 12


def test_stop_string_cuts_the_text(client):
    full = ask(client, max_tokens=12).choices[0].message.content
    assert len(full) > 4, full
    stop = full[2:4]
    reply = ask(client, max_tokens=12, stop=[stop, "\x00never"])
    assert reply.choices[0].message.content == full[: full.find(stop)]
    assert reply.choices[0].finish_reason == "stop"
    single = ask(client, max_tokens=12, stop=stop)
    assert single.choices[0].message.content == full[: full.find(stop)]


def test_seeded_sampling_repeats(client):
    first = ask(client, temperature=1.0, seed=7, max_tokens=8).choices[0].message.content
    again = ask(client, temperature=1.0, seed=7, max_tokens=8).choices[0].message.content
    assert first == again


def test_malformed_json_is_a_400_error_body(server):
    status, body = post(server[0], b"{not json")
    assert status == 400
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "fields",
    [
        {"messages": None},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {"temperature": -1},
        {"top_p": 0},
        {"max_tokens": 0},
        {"max_tokens": "many"},
        {"n": 2},
    ],
)
def test_bad_requests_are_400(server, fields):
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], **fields}
    status, reply = post(server[0], json.dumps(body).encode())
    assert status == 400, reply
    assert reply["error"]["message"]


def test_unknown_model_is_404(server):
    body = {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}
    status, reply = post(server[0], json.dumps(body).encode())
    assert status == 404
    assert reply["error"]["code"] == "model_not_found"


def test_context_too_long_is_400(server):
    too_many = {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}
    status, reply = post(server[0], json.dumps({**too_many, "max_tokens": CONTEXT}).encode())
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    long = {"model": NAME, "messages": [{"role": "user", "content": "word " * CONTEXT}]}
    status, reply = post(server[0], json.dumps(long).encode())
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"


def test_unknown_path_has_the_error_shape(server):
    try:
        urllib.request.urlopen(server[0] + "/v1/nothing", timeout=WAIT_S)
    except urllib.error.HTTPError as error:
        assert error.code == 404
        assert "message" in json.loads(error.read())["error"]
    else:
        pytest.fail("expected a 404")


def test_concurrent_requests_are_batched(client, server):
    backend = server[1]
    calls_before = backend.calls
    questions = [f"Question {i}?" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda q: ask(client, q, max_tokens=6), questions))
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in replies)
    assert backend.calls - calls_before < len(questions)
    assert backend.largest > 1
    # A batch gives each prompt what it gets alone (greedy).
    alone = ask(client, questions[3], max_tokens=6).choices[0].message.content
    assert replies[3].choices[0].message.content == alone


def test_cli_parses_serve_and_needs_the_extra(monkeypatch):
    from starpo.cli import parse_args
    from starpo.cli.serve import MISSING_EXTRA
    from starpo.errors import UserError

    args = parse_args(["serve", "--model", "some/dir", "--port", "0", "--max-batch", "2"])
    assert (args.host, args.port, args.max_batch, args.backend) == ("127.0.0.1", 0, 2, "auto")
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if not installed
    with pytest.raises(UserError, match="serve extra"):
        args.func(args)
    assert "\n" not in MISSING_EXTRA


def test_different_settings_go_in_separate_calls(client):
    budgets = [3, 5] * 4
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda b: ask(client, "Count.", max_tokens=b), budgets))
    for budget, reply in zip(budgets, replies, strict=True):
        assert reply.usage.completion_tokens <= budget
        if reply.choices[0].finish_reason == "length":
            assert reply.usage.completion_tokens == budget
    # Greedy, same prompt, same budget: the same reply in whichever batch it ran.
    short = {r.choices[0].message.content for r, b in zip(replies, budgets, strict=True) if b == 3}
    assert len(short) == 1
