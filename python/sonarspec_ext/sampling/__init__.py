"""Sampling: the sampler, shared by the engine and the drafters."""
