"""Vocab-parallel selected-token logprob: typed contract, dispatch and operator."""
