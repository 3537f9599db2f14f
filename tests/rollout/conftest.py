"""Fixtures for rollout tests: a tiny random model with the real tokenizer, and a fake backend
that replies with scripted text (token ids in, token ids out, like a real backend)."""

from __future__ import annotations

import pytest

from scripted_backend import ScriptedBackend


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer): 2-layer random Llama, real SmolLM2 tokenizer."""
    from starpo.models import tiny_random_model

    return tiny_random_model(seed=0)


@pytest.fixture
def scripted_backend():
    return ScriptedBackend
