"""Embeddings kept in a GGUF file's block format: rows dequantized as they are looked up equal
gguf's own dequantizer bit for bit (every format, awkward shapes); a tied embedding is the
lm_head's QuantizedMatrix and an untied one keeps its own blocks, with no float copy; such a
model embeds exactly as the same file loaded with float weights, and drafts natively exactly
as round by round."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

gguf = pytest.importorskip("gguf")

from helpers.drafting import PROMPTS, record_drafts, shared_draft_model  # noqa: E402
from helpers.gguf_fixtures import format_blocks, format_columns, write_gguf  # noqa: E402
from helpers.models import make_hf_model  # noqa: E402
from sonarspec_ext import _C, LLM, SpecConfig  # noqa: E402
from sonarspec_ext.bench import weight_bytes  # noqa: E402
from sonarspec_ext.layers.embedding import Embedding  # noqa: E402
from sonarspec_ext.models.loader import load_model  # noqa: E402
from sonarspec_ext.ops.quantized import QUANTIZED_FORMATS, QuantizedMatrix  # noqa: E402

T = gguf.GGMLQuantizationType
needs_simd = pytest.mark.skipif(_C.quant_kernel() == "portable",
                                reason="quantization='auto' keeps blocks only on CPUs with AVX2 or AVX-512 VNNI")


@pytest.mark.parametrize("fmt", list(QUANTIZED_FORMATS))
@pytest.mark.parametrize("n,k", [(1, 32), (17, 64), (50, 96), (33, 576), (130, 160)])
def test_rows_equal_the_gguf_dequantizer(fmt, n, k):
    k = format_columns(fmt, k)
    blocks = format_blocks(fmt, n, k, np.random.default_rng([n, k, 7]))
    qm = QuantizedMatrix.from_blocks(blocks, fmt, k)
    ref = np.asarray(gguf.dequantize(blocks, T[fmt.upper()]), dtype=np.float32).reshape(n, k)
    assert np.array_equal(qm.dequantize_rows(torch.arange(n)).numpy(), ref)
    ids = torch.tensor([[n - 1, 0, n // 2], [n // 2, n - 1, n - 1]])   # any shape, repeats
    out = qm.dequantize_rows(ids)
    assert out.dtype == torch.float32 and out.shape == (2, 3, k)
    assert np.array_equal(out.numpy(), ref[ids.numpy()])


def test_rows_outside_the_table_raise_and_write_nothing():
    qm = QuantizedMatrix.from_blocks(format_blocks("q8_0", 20, 64, np.random.default_rng(0)), "q8_0", 64)
    for bad in ([0, 20], [-1], [3, 2**40]):
        with pytest.raises(IndexError, match="out of range"):
            qm.dequantize_rows(torch.tensor(bad))
    assert qm.dequantize_rows(torch.tensor([], dtype=torch.long)).shape == (0, 64)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q6_k"])
def test_embedding_module_on_blocks_equals_its_float_table(fmt):
    k = format_columns(fmt, 64)
    qm = QuantizedMatrix.from_blocks(format_blocks(fmt, 40, k, np.random.default_rng(1)), fmt, k)
    emb = Embedding(40, k)
    del emb._parameters["weight"]
    emb.weight = qm
    ids = torch.tensor([[3, 39], [0, 3]])
    assert torch.equal(emb(ids), F.embedding(ids, qm.dequantize()))


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tied_emb"))
    make_hf_model(d, "llama", seed=8, tie_word_embeddings=True, num_key_value_heads=2)
    return d


def _all_tokens(model) -> torch.Tensor:
    return torch.arange(model.config.vocab_size)


@needs_simd
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_1])
def test_a_tied_embedding_is_the_lm_heads_blocks(tied_dir, tmp_path, qtype):
    path = write_gguf(tied_dir, str(tmp_path / "t.gguf"), qtype=qtype)
    model, floats = load_model(path, quantization="auto"), load_model(path, compact_weights=False)
    emb = model.model.embed_tokens.weight
    assert isinstance(emb, QuantizedMatrix) and emb is model.lm_head.weight
    assert not any(p.numel() >= emb.shape[0] * emb.shape[1] for p in model.parameters())   # no float copy
    assert torch.equal(model.embed_input(_all_tokens(model)), floats.embed_input(_all_tokens(floats)))
    assert weight_bytes(model) < weight_bytes(floats) / 3


@needs_simd
def test_an_untied_embedding_keeps_its_own_blocks(llama_dir, tmp_path):
    path = write_gguf(llama_dir, str(tmp_path / "u.gguf"), qtype=T.Q8_0)
    model, floats = load_model(path, quantization="auto"), load_model(path, compact_weights=False)
    emb = model.model.embed_tokens.weight
    assert isinstance(emb, QuantizedMatrix) and emb.format == "q8_0" and emb is not model.lm_head.weight
    assert torch.equal(model.embed_input(_all_tokens(model)), floats.embed_input(_all_tokens(floats)))
    # one decode step reads one row of an untied table: its bytes are not counted
    assert weight_bytes(model) == sum(m.weight.nbytes for m in model.modules()
                                      if isinstance(getattr(m, "weight", None), QuantizedMatrix)
                                      and m.weight is not emb) + sum(p.numel() * 4 for p in model.parameters())


def test_float_tensors_in_a_gguf_file_stay_float_tables(tied_dir, tmp_path):
    """An F32 embedding has no block format: quantizing the file's matrices at load
    quantizes the tied lm_head from it, and the embedding keeps its exact float values."""
    path = write_gguf(tied_dir, str(tmp_path / "f.gguf"))
    model = load_model(path, quantization="q8_0")
    assert isinstance(model.model.embed_tokens.weight, torch.Tensor)
    assert isinstance(model.lm_head.weight, QuantizedMatrix)
    floats = load_model(path, compact_weights=False)
    assert torch.equal(model.model.embed_tokens.weight, floats.model.embed_tokens.weight)


@needs_simd
@pytest.mark.parametrize("method,k", [("mtp", 3), ("draft_target", 4)])
def test_native_drafting_on_block_embeddings_equals_round_by_round(llama_dir, heads, tmp_path, method, k, monkeypatch):
    """The native chain reads embedding rows from the blocks (embedding.h) as the per-op path
    does through ``Embedding``: every step's proposals and the outputs agree, for an MTP head
    and for a draft model sharing the target's (quantized) embedding."""
    path = write_gguf(llama_dir, str(tmp_path / "d.gguf"), qtype=T.Q8_0)
    draft = heads["trained"] if method == "mtp" else shared_draft_model(llama_dir, str(tmp_path / "draft"))
    spec = SpecConfig(method=method, draft=draft, num_draft_tokens=k)
    a, out_a, used = record_drafts(path, spec, PROMPTS, True, monkeypatch)
    b, out_b, _ = record_drafts(path, spec, PROMPTS, False, monkeypatch)
    assert any(used), "the native chain never ran"
    assert a == b and out_a == out_b
    llm = LLM(path, spec=spec)
    emb = llm.engine.model.model.embed_tokens.weight
    assert isinstance(emb, QuantizedMatrix)
    assert llm.engine.proposer.runner.model.drafting_io()[0] is emb   # the drafter reads the same blocks
