"""`xconf judge`: verdicts for logprobs another system computed (verl, OpenRLHF, ...)."""
