"""Memory: what a training run will need, and how the process hands memory back.

- `plan`: the peak memory of a run, estimated from its config before any model loads;
- `shapes`: what the plan reads (a model's shape on the meta device, the longest episode);
- `fit`: the machine's memory against the plan (`starpo plan`, the check `starpo train`
  makes, the first setting that fits);
- `allocator`: the process's allocator settings for the rollout / update alternation.

Modules are imported by their full name: `starpo --help` must not pay for torch.
"""
