"""`starpo serve`: a model behind an OpenAI-compatible endpoint (wired into `starpo.cli`).

The parser needs neither torch nor FastAPI, so `starpo --help` stays fast; the command
loads them when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from starpo.errors import UserError

DESCRIPTION = """\
Serve a model (the embedded default, a trained run's model folder, or a hub id) as an
OpenAI-compatible API: GET /v1/models and POST /v1/chat/completions (streaming too), so
any OpenAI client, agent framework or eval harness can talk to it. Concurrent requests with
the same sampling settings are generated in one batch. Listens on 127.0.0.1 by default."""

MISSING_EXTRA = "starpo serve needs the serve extra: pip install 'starpo[serve]'"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `serve` command to `starpo`'s subparsers; returns its parser."""
    from starpo.cli.args import add_decode_flags
    from starpo.defaults import DEFAULT_MODEL

    p = subparsers.add_parser(
        "serve",
        help="serve a model behind an OpenAI-compatible endpoint",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model name, local folder or hub id, as for eval (default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--served-name", default=None, help="model id clients send (default: --model's value)"
    )
    add_address_flags(p, port=8000)
    add_decode_flags(p)
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=8,
        help="most requests generated together in one batch (default 8)",
    )
    p.set_defaults(func=cmd_serve)
    return p


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError(MISSING_EXTRA) from None
    app = load_app(
        args.model,
        served_name=args.served_name,
        device=args.device,
        backend=args.backend,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        max_batch=args.max_batch,
    )
    return serve_until_stopped(app, args, what=args.model, path="/v1")


def load_app(
    model: str,
    *,
    served_name: str | None = None,
    device: str = "cpu",
    backend: str = "auto",
    dtype: str = "auto",
    kv_dtype: str = "fp32",
    max_batch: int = 8,
) -> Any:
    """Load `model`, build its generation backend (as `starpo eval --model` does) and
    return the FastAPI app serving it."""
    from starpo.evaluation.model import load_generator
    from starpo.serve.app import build_app

    policy, tokenizer, generator = load_generator(model, device, backend, dtype, kv_dtype=kv_dtype)
    context = getattr(policy.config, "max_position_embeddings", None)
    return build_app(
        generator, tokenizer, served_name or model, context_length=context, max_batch=max_batch
    )


def add_address_flags(p: argparse.ArgumentParser, *, port: int) -> None:
    """A server command's --host (127.0.0.1 unless told) and --port."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=port, help=f"port (default {port})")


def serve_until_stopped(app: Any, args: argparse.Namespace, *, what: str, path: str = "") -> int:
    """Serve `app` on --host and --port with uvicorn until interrupted, having said where."""
    import uvicorn

    print(f"serving {what} on http://{args.host}:{args.port}{path}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
