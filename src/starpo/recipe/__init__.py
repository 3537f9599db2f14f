"""The multi-turn recipe: base model, SFT (on solver, random, weak or world-model play),
optionally rejection-sampling fine-tuning, then RL, each stage
in a folder of its own so a stopped recipe resumes (`starpo demo --env sokoban`).

- `methods`: what runs, per env (`Recipe`) and the RL methods `--methods` chooses from;
- `stages`: the stages and how they resume;
- `rft`: the RFT stage's flags, settings, seeds and rounds;
- `results`: the rows, their settings and minutes, and the printed table.
"""
