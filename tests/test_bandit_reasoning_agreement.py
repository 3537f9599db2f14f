"""experiments/bandit_reasoning_agreement.py: does a Bandit answer follow its reasoning?"""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "experiments" / "bandit_reasoning_agreement.py"
_spec = importlib.util.spec_from_file_location("bandit_reasoning_agreement", _PATH)
agreement_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agreement_script)


def _trajectory(first: str, think: str, actions: list[str]) -> dict:
    """A saved trajectory's first turn: its state and what the turn parser found."""
    other = "Dragon" if first == "Phoenix" else "Phoenix"
    return {"turns": [{"state": f"Arms: {first} | {other}", "think": think, "actions": actions}]}


def test_the_argued_arm_is_the_one_the_rationale_says_pays_more():
    argued = agreement_script.argued_arm
    assert argued("Dragon is the risky arm, but it pays more on average than Phoenix") == "Dragon"
    assert argued("the other arm, Phoenix, pays more on average than Dragon.") == "Phoenix"
    assert argued("I like dragons.") is None


def test_counts_answers_against_their_reasoning_and_the_first_listed_shortcut():
    argues_dragon = "Dragon pays more on average than Phoenix."
    rows = [
        _trajectory("Phoenix", argues_dragon, ["Phoenix"]),  # against its reasoning
        _trajectory("Dragon", argues_dragon, ["Dragon"]),
        _trajectory("Phoenix", argues_dragon, ["Dragon"]),
        _trajectory("Dragon", "", ["Dragon"]),  # no think block: argues none
        _trajectory("Phoenix", "", []),  # malformed: the parser found neither
    ]

    counts = agreement_script.agreement(rows)

    assert counts["episodes"] == 5
    assert counts["answered_first_listed"] == 3
    assert counts["answer_contradicts_think"] == 1
    assert counts["argued_to_answered"] == {
        "Dragon -> Dragon": 2,
        "Dragon -> Phoenix": 1,
        "None -> Dragon": 1,
        "None -> None": 1,
    }
