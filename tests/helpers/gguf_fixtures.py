"""GGUF files written by the tests with ``gguf.GGUFWriter``, from tiny HF model directories."""
import json
import os

import numpy as np

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def converter_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (rotate-half -> interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str) -> str:
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{LAYER_NAMES[rest]}"


def write_gguf(hf_dir: str, path: str, arch: str = "llama", qtype=None, tokenizer: bool = True,
               chat_template: str = None, skip_tensors=(), raw_tensors=None) -> str:
    """Writes the HF model in ``hf_dir`` as a GGUF file: 2-D weights in ``qtype`` (default
    F32), Q/K permuted as llama.cpp's converter does for Llama-style architectures;
    ``raw_tensors`` (HF name -> (bytes, type)) replaces tensors by raw blocks."""
    import gguf
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    if tokenizer:
        tok = json.load(open(os.path.join(hf_dir, "tokenizer.json")))
        vocab = dict(tok["model"]["vocab"])
        for added in tok.get("added_tokens", []):
            vocab[added["content"]] = added["id"]
        tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        special = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(tokens)
        w.add_token_types([3 if t in special else 1 for t in tokens])
        w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"].get("merges", [])])
        w.add_eos_token_id(cfg["eos_token_id"])
        w.add_bos_token_id(cfg["bos_token_id"])
        if chat_template:
            w.add_chat_template(chat_template)
    state = load_file(os.path.join(hf_dir, "model.safetensors"))
    for name, t in state.items():
        if name in skip_tensors:
            continue
        if name in (raw_tensors or {}):
            w.add_tensor(gguf_name(name), raw_tensors[name][0], raw_dtype=raw_tensors[name][1])
            continue
        a = t.float().numpy()
        if arch in ("llama", "mistral") and name.endswith(("q_proj.weight", "k_proj.weight")):
            a = converter_permute(a, heads if "q_proj" in name else kv)
        if qtype is not None and a.ndim == 2:
            w.add_tensor(gguf_name(name), gguf.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name(name), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path



# byte offsets of the float16 fields (scales, offsets / mins) in a GGUF block of each type
FLOAT16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2),
                  "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(qtype, rows: int, cols: int, rng, magnitude: float) -> np.ndarray:
    """Arbitrary raw blocks of a (rows, cols) matrix of a GGUF block type (every quant and
    scale byte value - beyond what a quantizer writes, e.g. Q8_0's -128; and K-quants, which
    gguf cannot quantize), the float16 fields drawn from N(0, magnitude)."""
    import gguf
    per_block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows, cols // per_block, nbytes), dtype=np.uint8)
    for at in FLOAT16_FIELDS[qtype.name]:
        halves = rng.normal(0, magnitude, size=b.shape[:2]).astype(np.float16)
        b[..., at:at + 2] = halves.view(np.uint8).reshape(*b.shape[:2], 2)
    return b.reshape(rows, -1)


# a magnitude of each format's float16 fields (scales, offsets) giving weights ~0.1
MAGNITUDE = {"q8_0": 0.005, "q4_0": 0.02, "q4_1": 0.02, "q4_k": 0.001, "q5_k": 0.0005, "q5_0": 0.01, "q5_1": 0.01,
             "q6_k": 0.0005}


def format_columns(fmt: str, k: int) -> int:
    """k for sonarspec's formats with blocks of 32; for the K-quants a multiple of 256 near it."""
    from sonarspec_ext.ops.quantized import block_columns
    return k if block_columns(fmt) == 32 else 256 * (k // 128 + 1)


def format_blocks(fmt: str, n: int, k: int, rng) -> np.ndarray:
    """Arbitrary GGUF blocks of an (n, k) matrix in sonarspec's format ``fmt`` (random_blocks)."""
    import gguf
    return random_blocks(gguf.GGMLQuantizationType[fmt.upper()], n, k, rng, MAGNITUDE[fmt])
