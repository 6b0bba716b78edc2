"""Tiny random transformers models (the oracle) saved as checkpoints, and loading them back."""
import torch

from sonarspec_ext.models.tokenizer import write_byte_tokenizer

VOCAB = 300


def make_hf_model(path: str, arch: str = "llama", seed: int = 0, **overrides):
    """Saves a random tiny transformers model (the oracle) plus a tokenizer to ``path``."""
    import transformers
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5, eos_token_id=256, bos_token_id=256)
    common.update(overrides)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**common)
        model = transformers.MistralForCausalLM(cfg)
    else:
        raise ValueError(arch)
    # Random init gives near-uniform logits; scale weights up so argmax is well separated.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(2.5)
            elif "bias" in n:
                p.normal_(0, 0.1)
    model.save_pretrained(path, safe_serialization=True)
    write_byte_tokenizer(path)
    return model.eval()


def hf_load(path, bf16_matmul_inputs: bool = False):
    """The transformers model in float32. ``bf16_matmul_inputs``: every linear layer's
    input is rounded to bfloat16 first - the arithmetic of sonarspec's compact (bfloat16)
    weights, whose matrix products take bfloat16 activations and sum in float32."""
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if bf16_matmul_inputs:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(lambda _, args: (args[0].bfloat16().float(),) + args[1:])
    return model


# ChatML, as SmolLM2 and Qwen render chats
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
