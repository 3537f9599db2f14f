"""The OpenAI-compatible HTTP app: GET /v1/models and POST /v1/chat/completions.

FastAPI (on uvicorn) because it is the ecosystem's standard for OpenAI-compatible servers
(vLLM, SGLang and llama-cpp-python serve the same API with it) and pydantic, which it
validates with, is already a starpo dependency. Request bodies are parsed by hand rather
than as FastAPI body parameters, so every invalid request gets OpenAI's error body with
status 400 instead of FastAPI's 422 shape.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from starpo.rollout.backends.base import Generation, GenerationBackend
from starpo.serve.batcher import Batcher, BatchKey

#: max_tokens when a request gives none (capped by what the context has left).
DEFAULT_MAX_TOKENS = 256


class ApiError(Exception):
    """An error the client caused (or may retry), sent as OpenAI's error body."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        """The content as one string: OpenAI also sends a list of typed parts."""
        if isinstance(self.content, str):
            return self.content
        if any(part.get("type") != "text" for part in self.content):
            raise ApiError(400, "only text content parts are supported", param="messages")
        return "".join(str(part.get("text", "")) for part in self.content)


class ChatRequest(BaseModel):
    """The fields of a chat completion request that starpo honours; others are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[Message] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    # vLLM's extension: continue the final (assistant) message instead of opening a new one,
    # e.g. after a pre-filled "<think>" (what `starpo eval --policy api --api-prefill` sends).
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        return [s for s in stops if s]  # an empty stop string would cut everything

    def stops(self) -> list[str]:
        return list(self.stop or [])


def build_app(
    backend: GenerationBackend,
    tokenizer: Any,
    model_name: str,
    *,
    stop_token_ids: list[int] | None = None,
    context_length: int | None = None,
    max_batch: int = 8,
) -> FastAPI:
    """A FastAPI app serving `backend` as model `model_name`. `context_length` (the model's
    max_position_embeddings) bounds prompt + max_tokens; the batcher's worker thread stops
    when the app shuts down."""
    from starpo.models import stop_token_ids as default_stops

    stops = list(stop_token_ids) if stop_token_ids is not None else default_stops(tokenizer)
    batcher = Batcher(backend, stops, max_batch=max_batch)
    server = _Server(tokenizer, model_name, batcher, context_length)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = FastAPI(title="starpo serve", lifespan=lifespan)
    app.state.batcher = batcher
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _server_error)
    app.add_api_route("/v1/models", server.models, methods=["GET"])
    app.add_api_route("/v1/chat/completions", server.chat, methods=["POST"])
    return app


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Routing errors (unknown path, wrong method) in OpenAI's shape too."""
    assert isinstance(exc, StarletteHTTPException)
    code = "not_found" if exc.status_code == 404 else None
    return ApiError(exc.status_code, str(exc.detail), code=code).response()


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    """Anything unexpected: a 500 with one line, never a traceback."""
    return ApiError(500, f"{type(exc).__name__}: {exc}").response()


class _Server:
    """The endpoints, over one tokenizer and batcher."""

    def __init__(
        self, tokenizer: Any, model_name: str, batcher: Batcher, context_length: int | None
    ):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.batcher = batcher
        self.context_length = context_length
        self.created = int(time.time())

    async def models(self) -> dict[str, Any]:
        card = {"id": self.model_name, "object": "model", "created": self.created}
        return {"object": "list", "data": [{**card, "owned_by": "starpo"}]}

    async def chat(self, request: Request) -> Any:
        chat = _parse(await request.body())
        if chat.model != self.model_name:
            message = (
                f"The model `{chat.model}` does not exist; this server has `{self.model_name}`"
            )
            raise ApiError(404, message, param="model", code="model_not_found")
        if chat.n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        prompt = self._prompt(chat)
        key = BatchKey(chat.temperature, chat.top_p, self._max_tokens(chat, len(prompt)), chat.seed)
        generation = await asyncio.wrap_future(self.batcher.submit(prompt, key))
        return self._reply(chat, len(prompt), generation)

    def _reply(self, chat: ChatRequest, prompt_tokens: int, generation: Generation) -> Any:
        """The completion body, or its stream of chunks."""
        text, finish = self._text(generation, chat.stops())
        completion_tokens = len(generation.token_ids)  # the end-of-turn token counts, as sampled
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time())}
        head["model"] = self.model_name
        if chat.stream:
            with_usage = bool((chat.stream_options or {}).get("include_usage"))
            chunks = self._chunks(head, generation, text, finish, usage if with_usage else None)
            return StreamingResponse(chunks, media_type="text/event-stream")
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return {**head, "object": "chat.completion", "choices": [choice], "usage": usage}

    def _prompt(self, chat: ChatRequest) -> list[int]:
        # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in chat.messages
        ]
        if chat.continue_final_message and (
            chat.add_generation_prompt or messages[-1]["role"] != "assistant"
        ):
            message = "continue_final_message needs add_generation_prompt=false and a final "
            raise ApiError(400, message + "assistant message", param="continue_final_message")
        text = self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=chat.add_generation_prompt,
            continue_final_message=chat.continue_final_message,
        )
        # The template writes the special tokens itself: no second bos from the tokenizer.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _max_tokens(self, chat: ChatRequest, prompt_length: int) -> int:
        asked = chat.max_completion_tokens or chat.max_tokens
        room = None if self.context_length is None else self.context_length - prompt_length
        if room is not None and (room < 1 or (asked is not None and asked > room)):
            wanted = asked or 1
            message = (
                f"This model's maximum context length is {self.context_length} tokens; the "
                f"messages take {prompt_length} and max_tokens is {wanted}"
            )
            raise ApiError(400, message, param="messages", code="context_length_exceeded")
        if asked is not None:
            return asked
        return DEFAULT_MAX_TOKENS if room is None else min(DEFAULT_MAX_TOKENS, room)

    def _text(self, generation: Generation, stops: list[str]) -> tuple[str, str]:
        """The reply and its finish_reason: the end-of-turn token dropped, then the text
        cut at the first stop string."""
        text = self._decode(_content_ids(generation))
        finish = generation.finish_reason
        cuts = [text.find(stop) for stop in stops if stop in text]
        if cuts:
            return text[: min(cuts)], "stop"
        return text, finish

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def _chunks(
        self,
        head: dict[str, Any],
        generation: Generation,
        text: str,
        finish: str,
        usage: dict[str, int] | None,
    ) -> AsyncIterator[str]:
        """OpenAI's stream: a role chunk, one chunk per token's text, a finish chunk, the
        usage chunk when asked, then [DONE]. The backend generates a reply in one call, so
        the chunks follow the finished generation."""
        head = {**head, "object": "chat.completion.chunk"}

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            return _sse({**head, "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(self._decode, _content_ids(generation), text):
            yield chunk({"content": piece})
        yield chunk({}, finish)
        if usage is not None:
            yield _sse({**head, "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"


def _parse(body: bytes) -> ChatRequest:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"{param}: {first['msg']}", param=param) from None


def _content_ids(generation: Generation) -> list[int]:
    """The generated tokens without the end-of-turn token the backend keeps."""
    stop = generation.stop_ids if generation.finish_reason == "stop" else []
    ids = generation.token_ids
    return ids[: len(ids) - len(stop)] if stop and ids[-len(stop) :] == stop else ids


def _pieces(decode: Any, token_ids: list[int], text: str) -> Iterator[str]:
    """`text` in pieces that end where each token's text ends; the pieces join to `text`
    exactly. A prefix ending in U+FFFD (half a multi-byte character) waits for the next."""
    sent = 0
    for end in range(1, len(token_ids) + 1):
        prefix = decode(token_ids[:end])
        if prefix.endswith("\ufffd"):
            continue
        upto = min(len(prefix), len(text))
        if upto > sent:
            yield text[sent:upto]
            sent = upto
    if sent < len(text):
        yield text[sent:]


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
