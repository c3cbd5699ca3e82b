"""xconf's torchrun launcher plugin for Hydra: ``hydra/launcher=torchrun``."""

__version__ = "0.1.0"
