"""Fixtures of the serve tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer): the tiny random policy the servers and players run."""
    from starpo.models import tiny_random_model

    return tiny_random_model(seed=0)
