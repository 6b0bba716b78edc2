"""Logits of paged prefill and paged token-by-token decoding vs transformers (oracle)."""
import pytest
import torch

from helpers.models import hf_load
from helpers.parity import paged_logits
from sonarspec_ext.runtime.kv_cache import KVCache
from sonarspec_ext.runtime.metadata import TreeBlock, build_metadata, tree_bits
from sonarspec_ext.runtime.runner import ModelRunner
from sonarspec_ext.models.loader import load_model


@pytest.mark.parametrize("fixture", ["llama_dir", "qwen_dir", "mistral_dir"])
@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("native", [False, True], ids=["sdpa", "native_attention"])
def test_prefill_and_decode_logits_match_transformers(fixture, page_size, native, request):
    path = request.getfixturevalue(fixture)
    model = load_model(path)
    hf = hf_load(path)
    g = torch.Generator().manual_seed(page_size)
    lens = [5, 17, 1, 33]
    prompts = [torch.randint(0, 290, (n,), generator=g).tolist() for n in lens]
    conts = [torch.randint(0, 290, (6,), generator=g).tolist() for _ in lens]
    ours = paged_logits(model, prompts, conts, page_size, native=native)
    for p, c, o in zip(prompts, conts, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([p + c])).logits[0]
        assert o.shape == ref.shape
        torch.testing.assert_close(o, ref, atol=1e-4, rtol=1e-4)


def test_prompt_longer_than_rope_original_context(llama_dir):
    """llama3 rope scaling matters past original_max_position_embeddings (64)."""
    model = load_model(llama_dir)
    hf = hf_load(llama_dir)
    p = torch.randint(0, 290, (150,), generator=torch.Generator().manual_seed(5)).tolist()
    o = paged_logits(model, [p], [[1, 2, 3]], page_size=16)[0]
    with torch.no_grad():
        ref = hf(torch.tensor([p + [1, 2, 3]])).logits[0]
    torch.testing.assert_close(o, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("native", [False, True], ids=["masked_sdpa", "native_cascade"])
def test_tree_block_queries_match_transformers_per_path(llama_dir, native):
    """Query block [a, b, c] after a prefix, b and c both children of a (positions 5, 6, 6):
    logits at b and c equal transformers on prefix+a+b and prefix+a+c, with the tree block
    as a full mask (SDPA) and as prefix + ancestor bits (native cascade)."""
    import numpy as np
    model = load_model(llama_dir)
    hf = hf_load(llama_dir)
    prefix, a, b, c = [3, 14, 15, 92, 65], 35, 89, 79
    cache = KVCache(model.config, 8, 4, torch.float32, "cpu")
    runner = ModelRunner(model, cache)
    table = [0, 1, 2]
    meta, pos = build_metadata([(0, 5, table)], 4, "cpu")
    runner.forward(torch.tensor(prefix), pos, meta, torch.tensor([4]))
    mask = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)
    meta, pos = build_metadata([(5, 3, table)], 4, "cpu", native_attention=native,
                               trees=[TreeBlock(5, tree_bits(mask), np.array([5, 6, 6]))])
    logits, hidden = runner.forward(torch.tensor([a, b, c]), pos, meta, torch.tensor([0, 1, 2]),
                                    hidden_indices=torch.tensor([1, 2]))
    with torch.no_grad():
        out_b = hf(torch.tensor([prefix + [a, b]]), output_hidden_states=True)
        out_c = hf(torch.tensor([prefix + [a, c]]), output_hidden_states=True)
    torch.testing.assert_close(logits[0], out_b.logits[0, -2], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], out_b.logits[0, -1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[2], out_c.logits[0, -1], atol=1e-4, rtol=1e-4)
    # last-layer (final-norm) hidden states, as transformers' last hidden_states entry
    torch.testing.assert_close(hidden[0], out_b.hidden_states[-1][0, -1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(hidden[1], out_c.hidden_states[-1][0, -1], atol=1e-4, rtol=1e-4)
