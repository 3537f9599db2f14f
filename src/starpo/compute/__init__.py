"""What a model computes on a batch of token rows: the layer under both training loops.

`starpo sft` and the StarPO trainer train the same models on the same rows, so they share
one account of it here, and neither reaches into the other:

- `batch`: trajectories -> padded (B, T) tensors aligned to token positions (`TrainBatch`);
- `forward`: the training forward passes (hidden states, logits, log-probs, entropy), with
  the plan that encodes a shared prompt once; `packing`: rows sharing a prompt packed into
  one sequence, and the cost model that picks packing or a shared KV cache;
- `flops`: the matmul FLOPs a pass computes and the peak they are set against;
- `activation_checkpointing`: decoder layers recomputed in backward instead of kept;
- `weights`: which weights train, their state (checkpoints, weight sync) and the export
  of a policy as a Hugging Face folder;
- `lr_schedule`: the warm-up + constant / cosine learning-rate factor both loops step by;
- `cpu_sharing`: whether a CPU job's torch threads find free cores (the trainer's warning).

Nothing is imported here: `lr_schedule` is read without torch (`starpo sft --help`).
"""
