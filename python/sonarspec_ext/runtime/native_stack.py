"""The native decoder stack of a model: its plain modules' weights, and the runner's KV
pools, wrapped as one ``ops.DecoderStack`` call - built here, outside the model - and a
step's tokens run through it.

A float32 CPU step runs every layer natively: at most ``stack.max_rows`` tokens per call,
larger steps in consecutive slices of the packed tokens (each slice's keys and values are
in the pool before the next attends to them). Every token's result then depends only on
its own sequence, never on the rest of the batch or on how its prompt was chunked.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..layers.norm import RMSNorm
from ..ops.decoder_stack import DecoderStack, LayerTensors, ModelTensors


def build_native_stack(model, kv_cache) -> Optional[DecoderStack]:
    """``model``'s layers (then its final norm; an MTP head's input projection first) as
    one ``ops.DecoderStack`` on ``kv_cache``'s float32 CPU pools, or None when they cannot
    run as one (gate and up not fused, biases outside q/k/v, bfloat16 activations, CUDA):
    the per-op path then runs them."""
    layers, rotary, final_norm, head_input = model.stack_parts()
    tensors, norms = [], [final_norm]
    for layer in layers:
        a, mlp = layer.self_attn, layer.mlp
        if (mlp.gate_up is None or mlp.gate_up[1] is not None or a.o_proj.bias is not None
                or mlp.down_proj.bias is not None):
            return None
        if a.qkv is not None:
            qkv, qkv_bias = a.qkv
        else:   # q, k, v of different formats, run side by side
            projections = (a.q_proj, a.k_proj, a.v_proj)
            if any(p.bias is not None for p in projections):
                return None
            qkv, qkv_bias = tuple(p.weight for p in projections), None
        in_norm, post_norm = layer.input_layernorm, layer.post_attention_layernorm
        if not isinstance(post_norm, RMSNorm) or not isinstance(in_norm, (RMSNorm, nn.Identity)):
            return None
        in_norm = in_norm if isinstance(in_norm, RMSNorm) else None
        norms += [in_norm, post_norm]
        k_pool, v_pool = kv_cache.layer(a.layer_idx)
        tensors.append(LayerTensors(
            input_norm=None if in_norm is None else in_norm.weight, post_norm=post_norm.weight,
            qkv=qkv, qkv_bias=qkv_bias, o=a.o_proj.weight,
            gate_up=mlp.gate_up[0], down=mlp.down_proj.weight, k_pool=k_pool, v_pool=v_pool))
    enorm, hnorm, fc = head_input or (None, None, None)
    norms += [enorm, hnorm]
    if not all(n is None or isinstance(n, RMSNorm) for n in norms):
        return None
    eps = {n.eps for n in norms if n is not None}
    if len(eps) != 1:
        return None
    w = lambda n: None if n is None else n.weight  # noqa: E731
    model = ModelTensors(rotary.cos, rotary.sin, fc=w(fc), fc_bias=None if fc is None else fc.bias,
                         enorm=w(enorm), hnorm=w(hnorm), final_norm=w(final_norm))
    first = layers[0].self_attn
    try:
        return DecoderStack(tensors, model, first.num_heads, first.num_kv_heads, eps.pop())
    except ValueError:
        return None


def run_native_stack(stack: DecoderStack, model, input_ids: torch.Tensor, positions: torch.Tensor, meta,
                     features: Optional[torch.Tensor] = None, capture: Sequence[int] = ()):
    """``model``'s final hidden states for the packed step through ``stack`` (an MTP head
    also reads ``features``; with ``capture``, (final, the residual streams after those
    layers (n, len(capture), hidden))), or None where the stack does not run it (metadata
    without the native attention's key ranges, inputs it does not take): the per-op path
    then."""
    x = model.embed_input(input_ids)
    if features is not None:
        features = features.to(x.dtype)
    if meta.native is None or x.shape[0] == 0 or not stack.accepts(x[:stack.max_rows]):
        return None
    n, step = x.shape[0], stack.max_rows
    if n <= step:
        return stack.forward(x, positions, meta.slot_mapping, meta.block_table, meta.page_size, *meta.native,
                             features=features, capture=capture)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    captured = torch.empty(n, len(capture), x.shape[1]) if capture else None
    for r in range(0, n, step):
        rows = slice(r, min(n, r + step))
        res = stack.forward(x[rows], positions[rows], meta.slot_mapping[rows], meta.block_table,
                            meta.page_size, *(t[rows] for t in meta.native),
                            features=None if features is None else features[rows], capture=capture)
        if capture:
            out[rows], captured[rows] = res
        else:
            out[rows] = res
    return (out, captured) if capture else out
