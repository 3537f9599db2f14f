"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the user's input (config, env id, argument, file).

    The message names the problem and the fix; the CLI shows it without a traceback.
    """


class UnknownName(UserError, KeyError):
    """A name no registry knows (an env id, an estimator, a backend...).

    A UserError for the CLI (one line, exit code 2) and a KeyError for code that uses a
    registry as a mapping (`name in registry`, `registry.get(name)`).
    """

    __str__ = UserError.__str__  # KeyError's own would quote the message


def unknown_name_message(kind: str, name: object, known: list[str]) -> str:
    """The one wording for every unknown name: what is unknown, the valid names, the closest."""
    guess = closest_match(str(name), known)
    hint = f"; did you mean {guess!r}?" if guess else ""
    return f"unknown {kind} {name!r}; valid: {', '.join(sorted(known))}{hint}"


def closest_match(word: str, candidates: list[str]) -> str | None:
    """The candidate most similar to `word`, or None when nothing is close."""
    import difflib

    matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.5)
    return matches[0] if matches else None
