"""Load a policy model and its tokenizer by name: the embedded default, a local folder, or a
Hugging Face hub id.

The same code runs on a CPU (fp32) and on CUDA (bf16 by default); nothing here assumes a
device beyond what `device` and `dtype` say.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import torch

from starpo.errors import UserError, closest_match
from starpo.models.embedded import DEFAULT_MODEL, ensure_default_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# Tokens that end an assistant turn in common chat templates (ChatML, Llama 3, Gemma, Phi).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")
HUB_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files come from: a local folder, or a hub id (`local_only` when the
    hub cannot be reached, so only the local Hugging Face cache is consulted)."""

    name: str  # what the user passed, for messages
    location: str  # a folder path or a hub id
    is_hub: bool
    local_only: bool


def resolve_device(device: str | torch.device) -> torch.device:
    """Parse `device`; a CUDA device on a machine without CUDA is a `UserError`."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise UserError(f"unknown device {device!r}; use 'cpu' or 'cuda' ({error})") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device!r} asked for, but CUDA is not available here; use 'cpu'")
    return parsed


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """Parse `dtype`; "auto" means bfloat16 on CUDA and float32 elsewhere.

    (CPU training stays fp32: bf16 matmuls are fast only on CPUs with native bf16, and
    rollouts pick their own dtype, see `precision.rollout_dtype`.)
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).strip().lower()
    if key == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if key not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; use one of: auto, {', '.join(DTYPES)}")
    return DTYPES[key]


def load_tokenizer(name: str | os.PathLike[str] = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
    """The chat tokenizer of model `name`, with a pad token and left padding.

    Tokenizers are cached in-process: repeated calls return the SAME object, so treat it
    as read-only (copy it with `copy.deepcopy` before changing it).
    """
    source = resolve_source(name)
    return _cached_tokenizer(source)


def load_model(
    name: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "auto",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode, on `device`.

    `name` is "smollm2-135m-instruct" (the embedded default, converted and cached on first
    use), a local folder holding a Hugging Face causal LM, or a hub id. The model's
    generation config stops on every end-of-turn token (see `stop_token_ids`). The tokenizer
    is shared (see `load_tokenizer`).
    """
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    source = resolve_source(name)
    tokenizer = _cached_tokenizer(source)  # cheap, and checks the chat template first
    model = _load_causal_lm(source, torch_dtype).to(torch_device).eval()
    align_generation_config(model, tokenizer)
    return model, tokenizer


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end an assistant turn: eos plus the known end-of-turn markers
    (`<|im_end|>` for ChatML) that this tokenizer has, without duplicates."""
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    ids.extend(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    for token in END_OF_TURN_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        # An unknown token maps to the unk id; keep it only if it IS the unk token.
        if token_id is not None and (
            token_id != tokenizer.unk_token_id or token == tokenizer.unk_token
        ):
            ids.append(token_id)
    return list(dict.fromkeys(ids))


def align_generation_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Make `model.generate` stop at any end-of-turn token and pad with the pad token."""
    if model.generation_config is None:
        return
    model.generation_config.eos_token_id = stop_token_ids(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id


def resolve_source(name: str | os.PathLike[str]) -> ModelSource:
    """Decide where `name`'s files come from, converting the default model if needed."""
    text = os.fspath(name)
    if text.strip().lower() == DEFAULT_MODEL:
        folder = ensure_default_model()
        return ModelSource(text, str(folder), is_hub=False, local_only=True)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(
                f"model folder '{text}' holds no config.json; pass a folder with a Hugging "
                f"Face causal LM (config.json, weights, tokenizer files)"
            )
        return ModelSource(text, str(path), is_hub=False, local_only=True)
    if path.exists():
        raise UserError(
            f"model '{text}' is a file; pass the folder that holds its config.json, "
            f"or use the default '{DEFAULT_MODEL}'"
        )
    if _looks_like_path(text):
        raise UserError(
            f"model folder '{text}' does not exist; pass an existing folder, a hub id, "
            f"or the default '{DEFAULT_MODEL}'"
        )
    return ModelSource(text, text, is_hub=True, local_only=not hub_reachable())


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the Hugging Face hub can be reached, checked in at most `timeout` seconds.

    Without this check an unreachable hub costs about a minute of retries. Offline mode
    (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) means no. Behind a proxy a direct probe says
    nothing, so the hub client is left to try.
    """
    if any(_env_true(var) for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return False
    if any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "", port), timeout=timeout).close()
    except OSError:
        return False
    return True


@functools.lru_cache(maxsize=16)
def _cached_tokenizer(source: ModelSource) -> PreTrainedTokenizerBase:
    """Load and prepare a tokenizer once per source (see `load_tokenizer`)."""
    from transformers import AutoTokenizer

    tokenizer = _from_source(AutoTokenizer.from_pretrained, source)
    if not tokenizer.chat_template:
        raise UserError(
            f"the tokenizer of model '{source.name}' has no chat template; starpo needs a "
            f"chat (instruct) model, or set tokenizer.chat_template yourself"
        )
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise UserError(
                f"the tokenizer of model '{source.name}' has neither a pad nor an eos token; "
                f"use a chat (instruct) model"
            )
        tokenizer.pad_token = tokenizer.eos_token
    # Batched generation with a decoder-only model needs the prompts' ends aligned.
    tokenizer.padding_side = "left"
    return tokenizer


def _load_causal_lm(source: ModelSource, dtype: torch.dtype) -> PreTrainedModel:
    """The causal LM's weights in `dtype` (on the CPU; the caller moves it)."""
    from transformers import AutoModelForCausalLM

    return _from_source(AutoModelForCausalLM.from_pretrained, source, dtype=dtype)


def _from_source(loader, source: ModelSource, **kwargs):
    """Call a transformers `from_pretrained` on `source`, turning "cannot get the files"
    into a one-line `UserError`."""
    try:
        return loader(source.location, local_files_only=source.local_only, **kwargs)
    except OSError as error:
        if not source.is_hub:
            message = f"cannot load model folder '{source.name}': {_first_line(error)}"
            raise UserError(message) from error
        raise UserError(_hub_message(source, error)) from None


def _hub_message(source: ModelSource, error: Exception) -> str:
    """The one-line message for a hub id that could not be loaded."""
    hint = closest_match(source.name.lower(), [DEFAULT_MODEL])
    did_you_mean = f" (did you mean '{hint}'?)" if hint else ""
    if source.local_only:
        return (
            f"cannot load model '{source.name}' from the Hugging Face hub (no network here?)"
            f"{did_you_mean}; download it on a machine with access and pass its local "
            f"folder, or use the default '{DEFAULT_MODEL}'"
        )
    return (
        f"cannot load model '{source.name}' from the Hugging Face hub: {_first_line(error)}"
        f"{did_you_mean}; check the id, pass a local folder, or use the default "
        f"'{DEFAULT_MODEL}'"
    )


def _looks_like_path(text: str) -> bool:
    """True for strings that can only be a file-system path, never a hub id
    ("org/name" has at most one slash and no leading dot, slash or tilde)."""
    return (
        text.startswith((".", "/", "~"))
        or "\\" in text
        or text.count("/") > 1
        or text.endswith("/")
        or (len(text) > 1 and text[1] == ":")  # a Windows drive
    )


def _env_true(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
