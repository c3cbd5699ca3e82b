"""Where in the model the drift begins: ``xconf localize RUN_DIR CASE_ID``.

Modules, one responsibility each: ``names`` (per-architecture tap name maps), ``capture``
(forward hooks and per-sample rows), ``sides`` (the hookable module inside an engine),
``inputs`` (what the run directory must provide), ``replay`` (engines built by the run's
adapter, scoring passes), ``analysis`` (noise floor and first divergence), ``artifact``
(the sealed ``localize.json`` + ``taps.safetensors``), ``service`` (all of it for one case).
"""
