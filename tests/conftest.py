import pytest

from helpers.models import VOCAB, make_hf_model  # noqa: F401  (VOCAB: for the fixtures below)

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
    from helpers.mtp_fixtures import random_head, save, trained_head
    d = tmp_path_factory.mktemp("heads")
    return {
        "random": save(random_head(llama_dir, "rmsnorm"), str(d / "random")),
        "random_eagle1": save(random_head(llama_dir, "eagle1", seed=1), str(d / "random_eagle1")),
        "trained": save(trained_head(llama_dir, str(d / "work")), str(d / "trained")),
        # reads the target's first layer too (EAGLE-3 style fused features)
        "fused": save(trained_head(llama_dir, str(d / "work_fused"), feature_layers=(0,)), str(d / "fused")),
    }
