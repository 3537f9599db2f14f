"""The multi-turn recipe: base model, SFT (on solver or random play), then RL, each stage
in a folder of its own so a stopped recipe resumes (`starpo demo --env sokoban`).

- `methods`: what runs, per env (`Recipe`) and the RL methods `--methods` chooses from;
- `stages`: the stages and how they resume;
- `results`: the rows, their settings and minutes, and the printed table.
"""
