import pytest
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


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("llama"))
    make_hf_model(d, "llama", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                  tie_word_embeddings=False)
    return d


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("qwen2"))
    make_hf_model(d, "qwen2", seed=1, tie_word_embeddings=True)
    return d


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


@pytest.fixture(scope="session")
def mistral_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("mistral"))
    make_hf_model(d, "mistral", seed=2, sliding_window=8, tie_word_embeddings=False)
    return d


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    """A different, smaller random model with the same tokenizer as ``llama_dir``."""
    d = str(tmp_path_factory.mktemp("draft"))
    make_hf_model(d, "llama", seed=11, num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                  num_key_value_heads=1, intermediate_size=48)
    return d


@pytest.fixture(scope="session")
def padded_draft_dir(tmp_path_factory):
    """Same architecture as ``llama_dir``'s, embeddings padded to a larger vocabulary."""
    d = str(tmp_path_factory.mktemp("padded_draft"))
    make_hf_model(d, "llama", seed=12, num_hidden_layers=1, vocab_size=VOCAB + 20)
    return d


@pytest.fixture(scope="session")
def plain_greedy(llama_dir):
    """Plain decoding of ``llama_dir`` with our engine, cached per (prompts, params)."""
    import json
    from sonarspec_ext import LLM
    llm, cache = LLM(llama_dir), {}

    def run(ps, params):
        key = (json.dumps(ps), repr(params))
        if key not in cache:
            cache[key] = [o.token_ids for o in llm.generate(ps, params)]
        return cache[key]
    return run


@pytest.fixture(scope="session")
def heads(llama_dir, tmp_path_factory):
    """MTP heads for the tiny Llama target: random (both layouts) and briefly trained."""
    from mtp_fixtures import random_head, save, trained_head
    d = tmp_path_factory.mktemp("heads")
    return {
        "random": save(random_head(llama_dir, "rmsnorm"), str(d / "random")),
        "random_eagle1": save(random_head(llama_dir, "eagle1", seed=1), str(d / "random_eagle1")),
        "trained": save(trained_head(llama_dir, str(d / "work")), str(d / "trained")),
    }
