from .config import CheckpointError, ModelConfig
from .llama import LlamaForCausalLM
from .loader import load_model, save_model

__all__ = ["CheckpointError", "ModelConfig", "LlamaForCausalLM", "load_model", "save_model"]
