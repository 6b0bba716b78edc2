"""sonarspec: an LLM inference engine built for lossless speculative decoding."""
from . import assets
from .llm import LLM
from .models.config import CheckpointError
from .params import RequestOutput, SamplingParams, SpecConfig

__all__ = ["LLM", "SamplingParams", "SpecConfig", "RequestOutput", "CheckpointError", "assets"]
__version__ = "0.1.0"
