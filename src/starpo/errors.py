"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the user's input (config, env id, argument, file).

    The message names the problem and the fix; the CLI shows it without a traceback.
    """


def closest_match(word: str, candidates: list[str]) -> str | None:
    """The candidate most similar to `word`, or None when nothing is close."""
    import difflib

    matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.5)
    return matches[0] if matches else None
