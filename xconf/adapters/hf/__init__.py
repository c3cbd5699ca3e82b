"""Training-side scorer: transformers, teacher-forced, read-only, optional FSDP2."""
