"""Runtimes whose two sides score one Hugging Face checkpoint (``vllm_hf``, ``hf_pair``): the
runtime that pairs the sides (``runtime.py``), what the sides share (``shared.py``), the
checkpoint options (``model_options.py``), freezing a recipe identity once (``identity.py``,
``dataset.py``) and the input limits a plan checks (``limits.py``)."""
