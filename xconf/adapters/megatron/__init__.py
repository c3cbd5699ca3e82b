"""Megatron-core as a training side: a ``GPTModel`` (local spec, no Transformer Engine) built from
the same Hugging Face checkpoint the other sides load, with xconf's own weight mapping checked
tensor by tensor, scoring the frozen tokens read-only on one rank or a tensor-parallel group.

``side.py`` declares the side (view, settings, handlers, build); ``arch.py`` what a checkpoint
is to Megatron (and what it refuses); ``weights.py`` the mapping; ``model.py`` the build;
``modules.py`` xconf's modules for the spec's slots; ``scorer.py`` and ``logprob.py`` the
scoring; ``state.py`` the live state; ``handlers.py`` the knobs; ``engine.py`` the engine;
``shims.py`` Megatron's CUDA-only and launcher-only calls, made to run on CPU. megatron-core is
imported lazily: the package imports without it (``requirements/megatron.txt`` pins it).
"""
