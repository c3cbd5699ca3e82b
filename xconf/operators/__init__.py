"""Semantic operators: the capability vocabulary, the catalog of descriptors and dispatch."""
