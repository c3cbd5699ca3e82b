"""xconf's Ray launcher plugin for Hydra: ``hydra/launcher=xconf_ray``."""

__version__ = "0.1.0"
