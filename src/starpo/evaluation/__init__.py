"""Every way episodes are played for a score, and the one summary of them.

- `summary`: `summarise`, the one summary of episodes (success with its 95% interval,
  pass@k, format, lengths) and the folder it is written to, for every kind of player;
- `model`: a model plays validation seeds through the rollout engine;
- `api`: an OpenAI-compatible chat model plays them with the same prompts and parser;
- `scripted`: scripted policies (random, solver) play an env on fixed seeds.
"""
