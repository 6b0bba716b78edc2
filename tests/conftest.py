import json
import os

import pytest
import torch

VOCAB = 300


def byte_tokenizer_json() -> dict:
    """A byte-level BPE tokenizer with no merges: 256 byte tokens + <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return json.loads(tok.to_str())


def write_tokenizer(path: str):
    with open(os.path.join(path, "tokenizer.json"), "w") as fh:
        json.dump(byte_tokenizer_json(), fh)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}, fh)


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
    write_tokenizer(path)
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


def hf_load(path):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
