"""``DecoderStack``: a model's Llama decoder layers as one native call per small CPU step.

RoPE angles from the tables, an MTP head's input projection when there is one, then per
layer: RMSNorm, fused q/k/v GEMM (+ bias), RoPE, KV store into the paged pools,
paged attention, o GEMM + residual, RMSNorm, gated SiLU MLP + residual; then an optional
final RMSNorm. The native code calls the kernels the per-op path calls, in the same
order, so the two agree bit for bit; the stack removes the Python and dispatch work
between the kernels, which dominates a decoding step of a small model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .. import _C
from .checks import DTYPE_CODES, check_page_size, check_tensor
from .limits import COMPACT_MAX_ROWS, NATIVE_MAX_ROWS, SMALL_M_MAX_ROWS
from .linear import native_threads
from .quantized import QuantizedMatrix, weight_format_code


@dataclass
class LayerTensors:
    """One decoder layer's inference tensors (norms float32; matrices float32, bfloat16 or
    ``QuantizedMatrix``, each in its own format)."""
    input_norm: Optional[torch.Tensor]   # (hidden,) or None: no input norm (EAGLE-1 heads)
    post_norm: torch.Tensor              # (hidden,)
    qkv: object                          # ((num_heads + 2 * num_kv_heads) * head_dim, hidden), or (q, k, v)
    qkv_bias: Optional[torch.Tensor]     # float32 or None
    o: torch.Tensor                      # (hidden, num_heads * head_dim)
    gate_up: torch.Tensor                # (2 * inter, hidden): gate rows over up rows
    down: torch.Tensor                   # (hidden, inter)
    k_pool: torch.Tensor                 # (num_slots, num_kv_heads, head_dim) float32/float16/bfloat16
    v_pool: torch.Tensor


@dataclass
class ModelTensors:
    """What a stack needs besides its layers (float32): RoPE tables (max_positions,
    head_dim // 2), an MTP head's input projection ``x = fc(cat(enorm(x), hnorm(features)))
    (+ fc_bias)`` (``fc`` None: none; norms None: EAGLE-1 heads) and a final norm."""
    cos: torch.Tensor
    sin: torch.Tensor
    fc: Optional[torch.Tensor] = None         # (hidden, 2 * hidden), the layers' weight dtype
    fc_bias: Optional[torch.Tensor] = None
    enorm: Optional[torch.Tensor] = None
    hnorm: Optional[torch.Tensor] = None
    final_norm: Optional[torch.Tensor] = None


def _check_matrix(name: str, t, shape) -> None:
    """A stack matrix of ``shape``: a QuantizedMatrix, or a 2-D float32 / bfloat16 CPU tensor."""
    if not isinstance(t, QuantizedMatrix):
        check_tensor(name, t, dtypes=(torch.float32, torch.bfloat16), ndim=2, device=torch.device("cpu"))
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {list(t.shape)}, expected {list(shape)}")


def _qkv_parts(qkv) -> tuple:
    """A layer's q/k/v matrices as the native stack takes them: (qkv, None, None) or (q, k, v)."""
    return tuple(qkv) if isinstance(qkv, (tuple, list)) else (qkv, None, None)


class DecoderStack:
    """Validates the tensors once and keeps them alive; ``forward`` runs one step."""

    def __init__(self, layers: Sequence[LayerTensors], model: ModelTensors, num_heads: int, num_kv_heads: int,
                 eps: float):
        if not layers:
            raise ValueError("DecoderStack needs at least one layer")
        hidden = layers[0].post_norm.shape[0]
        head_dim = layers[0].k_pool.shape[-1]
        inter = layers[0].down.shape[1]
        q_rows, kv_rows = num_heads * head_dim, num_kv_heads * head_dim
        shapes = {"qkv": (q_rows + 2 * kv_rows, hidden), "o": (hidden, q_rows), "gate_up": (2 * inter, hidden),
                  "down": (hidden, inter)}
        pool_shape, kv_dtype = tuple(layers[0].k_pool.shape), layers[0].k_pool.dtype
        if kv_dtype not in DTYPE_CODES:
            raise ValueError(f"KV pools have dtype {kv_dtype}: float32, float16 or bfloat16 expected")
        if len(pool_shape) != 3 or pool_shape[1] != num_kv_heads:
            raise ValueError(f"KV pools have shape {list(pool_shape)}, expected [slots, {num_kv_heads}, head_dim]")
        for i, L in enumerate(layers):
            for name, shape in shapes.items():
                if name == "qkv" and _qkv_parts(L.qkv)[1] is not None:
                    for part, t, rows in zip("qkv", _qkv_parts(L.qkv), (q_rows, kv_rows, kv_rows)):
                        _check_matrix(f"layer {i} {part}", t, (rows, hidden))
                else:
                    _check_matrix(f"layer {i} {name}", getattr(L, name), shape)
            for name in ("input_norm", "post_norm", "qkv_bias"):
                t = getattr(L, name)
                if t is not None:
                    check_tensor(f"layer {i} {name}", t, dtypes=(torch.float32,), ndim=1)
                    want = shapes["qkv"][0] if name == "qkv_bias" else hidden
                    if t.shape[0] != want:
                        raise ValueError(f"layer {i} {name} has {t.shape[0]} entries, expected {want}")
            for name in ("k_pool", "v_pool"):
                t = getattr(L, name)
                check_tensor(f"layer {i} {name}", t, dtypes=(kv_dtype,), ndim=3, device=torch.device("cpu"))
                if tuple(t.shape) != pool_shape:
                    raise ValueError(f"layer {i} {name} has shape {list(t.shape)}, expected {list(pool_shape)}")
        half = head_dim // 2
        for name in ("cos", "sin"):
            t = getattr(model, name)
            check_tensor(name, t, dtypes=(torch.float32,), ndim=2, device=torch.device("cpu"))
            if t.shape[1] != half or t.shape != model.cos.shape:
                raise ValueError(f"{name} table has shape {list(t.shape)}, expected [max_positions, {half}]")
        if model.fc is not None:
            _check_matrix("fc", model.fc, (hidden, 2 * hidden))
            if (model.enorm is None) != (model.hnorm is None):
                raise ValueError("enorm and hnorm go together: pass both or neither")
        for name in ("fc_bias", "enorm", "hnorm", "final_norm"):
            t = getattr(model, name)
            if t is not None:
                check_tensor(name, t, dtypes=(torch.float32,), ndim=1)
                if t.shape[0] != hidden:
                    raise ValueError(f"{name} has {t.shape[0]} entries, expected {hidden}")
        self.layers, self.model, self.hidden, self.half = list(layers), model, hidden, half
        # Rows up to which every op of the per-op path runs natively (and so this stack may).
        matrices = [m for L in layers for m in (*_qkv_parts(L.qkv), L.o, L.gate_up, L.down) if m is not None]
        matrices += [] if model.fc is None else [model.fc]
        f32 = any(getattr(m, "dtype", None) == torch.float32 for m in matrices)
        self.max_rows = min(SMALL_M_MAX_ROWS if f32 else COMPACT_MAX_ROWS, NATIVE_MAX_ROWS)
        self._checked_io = None   # (embed, lm_head) checked by ops.stack_drafting for drafting calls
        p = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
        code = lambda t: 0 if t is None else weight_format_code(t)  # noqa: E731
        self._native = _C.DecoderStack(
            hidden, num_heads, num_kv_heads, head_dim, inter, pool_shape[0], float(eps), float(head_dim ** -0.5),
            [(p(L.input_norm), p(L.post_norm), *(p(t) for t in _qkv_parts(L.qkv)), p(L.qkv_bias), p(L.o),
              p(L.gate_up), p(L.down), p(L.k_pool), p(L.v_pool)) for L in layers],
            [(*(code(t) for t in _qkv_parts(L.qkv)), code(L.o), code(L.gate_up), code(L.down)) for L in layers],
            tuple(p(getattr(model, n)) for n in ("cos", "sin", "fc", "fc_bias", "enorm", "hnorm", "final_norm")),
            code(model.fc), model.cos.shape[0], DTYPE_CODES[kv_dtype])

    def accepts(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is a step this stack runs: float32 CPU rows, at most ``max_rows``."""
        return (x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2
                and x.shape[1] == self.hidden and 0 < x.shape[0] <= self.max_rows
                and not (torch.is_grad_enabled() and x.requires_grad))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                block_table: torch.Tensor, page_size: int, token_seq: torch.Tensor, key_begin: torch.Tensor,
                key_end: torch.Tensor, tree_begin: Optional[torch.Tensor] = None,
                tree_mask: Optional[torch.Tensor] = None, features: Optional[torch.Tensor] = None,
                capture: Sequence[int] = ()):
        """x (m, hidden) token embeddings -> final_norm(layers(x)) (m, hidden), ``x`` left
        unchanged; an MTP head first projects x with ``features`` (m, hidden). positions (m,)
        int64 (RoPE); the rest is the step's paged-attention metadata (int64, see
        ``ops.paged_attention``); the new tokens' K/V are written to the pools (slots outside
        them skipped, as ``ops.kv_store`` does: negative slots mark padding). ``capture``:
        layer indices whose output residual streams are returned too, as (final, (m,
        len(capture), hidden))."""
        if not self.accepts(x):
            raise ValueError(f"DecoderStack runs float32 CPU inputs of shape (1..{self.max_rows}, {self.hidden}), "
                             f"got {x.dtype} {list(x.shape)} on {x.device}")
        m = x.shape[0]
        if (tree_begin is None) != (tree_mask is None):
            raise ValueError("tree_begin and tree_mask go together: pass both or neither")
        tree = () if tree_mask is None else (("tree_begin", tree_begin), ("tree_mask", tree_mask))
        for name, t in (("positions", positions), ("slot_mapping", slot_mapping), ("token_seq", token_seq),
                        ("key_begin", key_begin), ("key_end", key_end)) + tree:
            if t.dtype != torch.int64 or t.shape != (m,) or not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError(f"{name} must be a contiguous int64 CPU tensor of shape [{m}]")
        if self.model.fc is not None:
            if features is None:
                raise ValueError("this stack is an MTP head's: pass features")
            check_tensor("features", features, dtypes=(torch.float32,), ndim=2, contiguous=False)
            features = features.contiguous()
            if features.shape != x.shape:
                raise ValueError(f"features have shape {list(features.shape)}, expected {list(x.shape)}")
        check_tensor("block_table", block_table, dtypes=(torch.int64,), ndim=2, device=torch.device("cpu"))
        check_page_size(page_size)
        layers = captured = None   # built only when asked for: every decode step calls this
        if capture:
            if not all(0 <= i < len(self.layers) for i in capture):
                raise ValueError(f"captured layers {list(capture)} must lie in [0, {len(self.layers)})")
            layers = torch.tensor(list(capture), dtype=torch.int64)
            captured = torch.empty(m, len(capture), self.hidden)
        out = x.clone(memory_format=torch.contiguous_format)
        try:
            bad = self._native.forward(
                out.data_ptr(), 0 if features is None else features.data_ptr(), m, positions.data_ptr(),
                slot_mapping.data_ptr(), block_table.data_ptr(), block_table.shape[0], block_table.shape[1],
                page_size,
                token_seq.data_ptr(), key_begin.data_ptr(), key_end.data_ptr(),
                0 if tree_begin is None else tree_begin.data_ptr(), 0 if tree_mask is None else tree_mask.data_ptr(),
                out.data_ptr(), native_threads(), 0 if layers is None else layers.data_ptr(), len(capture),
                0 if captured is None else captured.data_ptr())
        except IndexError as e:
            raise ValueError(str(e)) from None
        if bad:
            raise ValueError(f"DecoderStack: {bad} token-layers had a KV slot past the pools or attended to no "
                             f"key (token_seq, block_table page ids or key ranges out of range)")
        return out if captured is None else (out, captured)
