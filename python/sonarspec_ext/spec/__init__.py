"""Speculation schemes, expressed as draft proposers verified by the engine's target pass."""
from .proposer import Draft, NoProposer, Proposer

__all__ = ["Draft", "NoProposer", "Proposer"]
