"""Replacement arms: the training model computes a kind of module exactly as vLLM does.

Each arm (``training.align.<kind>=vllm``, docs/arms.md) replaces the forward of every module
of its kind in the loaded transformers model with one that calls vLLM's own layer or kernel,
chosen as vLLM's CPU platform chooses it; no weight changes and transformers is never edited.

- ``kernels``: vLLM's layers and kernels, built outside an engine as vLLM's eager CPU path
  builds them (rotary, RMSNorm, SiluAndMul, the GEMM dispatch, CPU attention, the sampler).
- ``step``: what one forward scores (its requests, positions, KV caches), read by the forwards.
- ``forwards``: the replacement forwards of the Llama-family layout.
- ``apply``: which modules each arm replaces, and the live count read back from the model.
- ``handlers``: the knobs' handlers (materialize at bind time, read back from the scorer).
"""
