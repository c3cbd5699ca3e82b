"""vLLM rollout scorer: engine construction, forced decoding, decode/prefill scoring."""
