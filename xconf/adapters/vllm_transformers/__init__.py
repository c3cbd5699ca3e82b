"""The `vllm_hf` runtime: vLLM rollout scorer paired with a Hugging Face training scorer."""
