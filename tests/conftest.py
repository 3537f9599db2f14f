"""Shared fixtures.

The test session gets its own STARPO_CACHE (a session temp folder), so tests never read or
write the user's ~/.cache/starpo. Nothing heavy happens at start-up: the first test that
needs the default model or its tokenizer (`default_model`, `tiny_random_model()`,
`load_tokenizer()`) converts the embedded GGUF into that folder, once per session (~20 s).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def starpo_cache(tmp_path_factory):
    """Point STARPO_CACHE at a per-session temp folder for the whole session."""
    root = tmp_path_factory.mktemp("starpo_cache")
    previous = os.environ.get("STARPO_CACHE")
    os.environ["STARPO_CACHE"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("STARPO_CACHE", None)
    else:
        os.environ["STARPO_CACHE"] = previous


@pytest.fixture(scope="session")
def default_model(starpo_cache):
    """(model, tokenizer) of the embedded default model, converted and loaded once."""
    from starpo.models import load_model

    return load_model()
