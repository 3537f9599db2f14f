"""Generation backends: what turns a batch of token prompts into sampled continuations.

- `base`: the `GenerationBackend` protocol, requests, sampling parameters and the stop rule;
- `hf`: any Hugging Face causal LM through `generate` (`rollout.backend=hf`);
- `lean`: the CPU decoder with KV reuse across turns (`rollout.backend=lean`), built from
  `lean_decoder` (the layers), `lean_kv_store` (the paged cache) and `linear_kernels`.

`starpo.rollout` exports the protocol and `HFBackend`; the registry names them
(`registry.GENERATION_BACKENDS`).
"""
