"""Runtime adapters (subpackages). Importing this package imports no runtime."""
