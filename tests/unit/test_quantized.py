"""Block-quantized GEMMs (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) against gguf's own quantizer and dequantizer:
the packing is a lossless byte permutation, and each product equals a float64 reference of
(gguf-dequantized weights) x (the activations rounded per block of 32 to int8 by the stated
rule) to float32 rounding; rows never depend on the row count, the thread count or the
CPU path (AVX-512 VNNI vs portable loops, bit for bit)."""
import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch

from helpers import gguf_fixtures

from sonarspec_ext import _C
from sonarspec_ext.ops.elementwise import silu_and_mul
from sonarspec_ext.ops.linear import kernel_linear, kernel_mlp
from sonarspec_ext.ops.quantized import K_QUANTS, QUANTIZED_FORMATS, QuantizedMatrix

FORMATS = list(QUANTIZED_FORMATS)
cols, random_blocks = gguf_fixtures.format_columns, gguf_fixtures.format_blocks


def int8_rows(x: np.ndarray) -> np.ndarray:
    """The kernel's activation rounding, written independently: per block of 32, d = amax / 127
    and q = rint(x * (1 / d)) clamped to +-127, in float32; the rounded values q * d."""
    m, k = x.shape
    b = x.astype(np.float32).reshape(m, k // 32, 32)
    d = (np.abs(b).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.rint(b * inv), -127, 127)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(m, k)


def sample_matrix(fmt: str, n: int, k: int, seed: int) -> QuantizedMatrix:
    """gguf's quantization of a random matrix; random K-quant blocks (gguf has no K quantizer)."""
    if fmt in K_QUANTS:
        return QuantizedMatrix.from_blocks(random_blocks(fmt, n, k, np.random.default_rng(seed)), fmt, k)
    return QuantizedMatrix.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(1, 32), (17, 64), (50, 96), (33, 576), (130, 160)])
def test_packing_round_trips_and_dequantizes_as_gguf(fmt, n, k):
    k = cols(fmt, k)
    rng = np.random.default_rng([n, k])
    blocks = random_blocks(fmt, n, k, rng)
    qm = QuantizedMatrix.from_blocks(blocks, fmt, k)
    assert np.array_equal(qm.to_blocks(), blocks)
    assert qm.nbytes == _C.quant_packed_bytes(qm.code, n, k)
    ref = gguf.dequantize(blocks, gguf.GGMLQuantizationType[fmt.upper()]).reshape(n, k)
    assert np.array_equal(qm.dequantize().numpy(), ref.astype(np.float32))
    rows = torch.tensor([n - 1, 0, n // 2])
    assert np.array_equal(qm.select_rows(rows).to_blocks(), blocks[rows.numpy()])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k", [(1, 17, 64), (3, 50, 96), (8, 33, 576), (9, 40, 128), (70, 24, 32)])
def test_gemm_matches_float64_reference(fmt, m, n, k):
    k = cols(fmt, k)
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    rng = np.random.default_rng([m, n, k])
    for qm in (sample_matrix(fmt, n, k, m + n), QuantizedMatrix.from_blocks(random_blocks(fmt, n, k, rng), fmt, k)):
        x = torch.randn(m, k, generator=g) * 2
        bias = torch.randn(n, generator=g)
        y = kernel_linear(x, qm, bias)
        w = qm.dequantize().double().numpy()
        xr = int8_rows(x.numpy())
        ref = xr @ w.T + bias.double().numpy()
        # float32 accumulation over k / 16 (Q6_K) or k / 32 sub-block terms, each exact up to
        # the roundings of its scale products
        scale = np.abs(xr) @ np.abs(w).T + np.abs(bias.double().numpy())
        err = np.abs(y.double().numpy() - ref)
        assert (err <= 2e-6 * (k // 16 + 2) * scale + 1e-30).all(), err.max()


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_do_not_depend_on_row_or_thread_count(fmt):
    g = torch.Generator().manual_seed(7)
    qm = sample_matrix(fmt, 200, 256, 7)
    x = torch.randn(70, 256, generator=g)
    alone = torch.cat([kernel_linear(x[i:i + 1], qm) for i in range(70)])
    prev = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in (2, 5, 8, 13, 70):
                assert torch.equal(kernel_linear(x[:m], qm), alone[:m]), (threads, m)
    finally:
        torch.set_num_threads(prev)


def test_mlp_equals_its_gemms():
    g = torch.Generator().manual_seed(3)
    for fmt in FORMATS:
        hidden, inter = cols(fmt, 64), cols(fmt, 96)
        gu, down = sample_matrix(fmt, 2 * inter, hidden, 1), sample_matrix(fmt, hidden, inter, 2)
        x = torch.randn(5, hidden, generator=g)
        ref = kernel_linear(silu_and_mul(kernel_linear(x, gu)), down)
        assert torch.equal(kernel_mlp(x, gu, down), ref)


def test_non_finite_rows_stay_in_their_row():
    qm = QuantizedMatrix.quantize(torch.randn(32, 64), "q8_0")
    x = torch.randn(3, 64)
    clean = kernel_linear(x, qm)
    x[1, 5] = float("nan")
    x[2, 40] = float("inf")
    y = kernel_linear(x, qm)
    assert torch.equal(y[0], clean[0])
    assert not torch.isfinite(y[1]).any() and not torch.isfinite(y[2]).any()


_SCRIPT = """
import json, sys, numpy as np, torch, gguf
sys.path.insert(0, sys.argv[1])   # the tests directory
from helpers.gguf_fixtures import random_blocks
from sonarspec_ext import _C
from sonarspec_ext.ops.linear import kernel_linear
from sonarspec_ext.ops.quantized import QuantizedMatrix
g = torch.Generator().manual_seed(11)
out = {"kernel": _C.quant_kernel(), "prefetch": _C.weight_prefetch()}
for fmt in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
    for m, n, k in ((1, 37, 96), (1, 14, 32), (2, 27, 64), (5, 40, 64), (9, 23, 160), (4, 16, 32)):
        qm = QuantizedMatrix.quantize(torch.randn(n, k, generator=g), fmt)
        y = kernel_linear(torch.randn(m, k, generator=g) * 3, qm)
        out[f"{fmt} {m}x{n}x{k}"] = y.view(torch.int32).flatten().tolist()
# activations whose quants are ties (blocks scaled to 127: x * inv = k + 0.5, rounded to even)
# and of extreme magnitudes (below ~4e-37 a block's 1 / d overflows to infinity): every
# kernel's quantizer follows the portable rule
ties = torch.randint(-127, 127, (7, 96), generator=g).float() + 0.5
ties[:, ::32] = 127.0
for name, x in (("ties", ties), ("huge", torch.randn(3, 96, generator=g) * 1e30),
                ("tiny", torch.randn(3, 96, generator=g) * 1e-30),
                ("infinite 1/d", torch.randn(3, 96, generator=g) * 1e-38)):
    qm = QuantizedMatrix.quantize(torch.randn(21, 96, generator=g), "q4_1")
    out[f"quantizer {name}"] = kernel_linear(x, qm).view(torch.int32).flatten().tolist()
# Q8_0 quants at both extremes (-128 and 127) against activations that round to +-127
blocks = QuantizedMatrix.quantize(torch.randn(24, 64, generator=g), "q8_0").to_blocks().reshape(24, 2, 34).copy()
quants = blocks[..., 2:].view(np.int8)
quants[::2, :, ::3] = -128
quants[1::2, :, 1::3] = 127
x = torch.where(torch.rand(6, 64, generator=g) < 0.5, -1.0, 1.0)
y = kernel_linear(x, QuantizedMatrix.from_blocks(blocks.reshape(24, 68), "q8_0", 64))
out["q8_0 extremes"] = y.view(torch.int32).flatten().tolist()
# K-quants: every scale and quant byte value, 1 to 9 activation rows
rng = np.random.default_rng(5)
for fmt in ("q4_k", "q5_k", "q6_k"):
    for m, n, k in ((1, 37, 256), (1, 27, 512), (5, 40, 512), (9, 23, 768)):
        b = random_blocks(gguf.GGMLQuantizationType[fmt.upper()], n, k, rng, 1e-3)
        qm = QuantizedMatrix.from_blocks(b, fmt, k)
        y = kernel_linear(torch.randn(m, k, generator=g) * 3, qm)
        out[f"{fmt} {m}x{n}x{k}"] = y.view(torch.int32).flatten().tolist()
print(json.dumps(out))
"""


def _run(kernel=None, prefetch=None):
    env = dict(os.environ)
    env.pop("SONARSPEC_QUANT_KERNEL", None)
    env.pop("SONARSPEC_WEIGHT_PREFETCH", None)
    if kernel:
        env["SONARSPEC_QUANT_KERNEL"] = kernel
    if prefetch:
        env["SONARSPEC_WEIGHT_PREFETCH"] = prefetch
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", _SCRIPT, tests_dir], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_every_kernel_gives_the_portable_bits():
    """The VNNI kernel under each weight prefetch mode, the 256-bit VPDPBUSD kernel and the
    AVX2 kernel equal the portable loops bit for bit (the portable loops are tied to a
    float64 reference above) on awkward shapes and extreme quants. Where the AVX-512 VNNI
    kernel runs, each cap runs the kernel it names."""
    portable = _run("portable")
    assert portable["kernel"] == "portable"
    ran = 0
    for kernel, prefetch in (("avx2", None), ("avxvnni", None), (None, "near"), (None, "far"), (None, "none")):
        fast = _run(kernel, prefetch)
        if fast["kernel"] == "portable" or (prefetch and fast["kernel"] != "vnni"):
            continue
        ran += 1
        assert prefetch is None or fast["prefetch"] == prefetch
        assert not kernel or _C.quant_kernel() != "vnni" or fast["kernel"] == kernel
        for case, bits in portable.items():
            if case not in ("kernel", "prefetch"):
                assert fast[case] == bits, (fast["kernel"], prefetch, case)
    if not ran:
        pytest.skip("this CPU runs only the portable kernel")


def test_prefetch_modes_switch_and_unknown_ones_raise():
    was = _C.weight_prefetch()
    assert was in ("near", "far", "none")
    try:
        for mode in ("near", "far", "none"):
            _C.set_weight_prefetch(mode)
            assert _C.weight_prefetch() == mode
        with pytest.raises(ValueError, match="'l3' is not one of near, far, none"):
            _C.set_weight_prefetch("l3")
        assert _C.weight_prefetch() == "none"
    finally:
        _C.set_weight_prefetch(was)


def test_bad_shapes_and_formats_raise():
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizedMatrix.quantize(torch.randn(4, 48), "q8_0")
    with pytest.raises(ValueError, match="cannot quantize to 'q3_k'"):
        QuantizedMatrix.quantize(torch.randn(4, 64), "q3_k")
    with pytest.raises(ValueError, match="uint8 bytes"):
        QuantizedMatrix(torch.zeros(10, dtype=torch.uint8), "q4_0", (16, 64))
    with pytest.raises(ValueError, match="blocks of a matrix"):
        QuantizedMatrix.from_blocks(np.zeros((4, 30), dtype=np.uint8), "q4_1", 64)
    with pytest.raises(ValueError, match="unknown quantized format 'bf16'"):
        QuantizedMatrix.from_blocks(np.zeros((4, 128), dtype=np.uint8), "bf16", 64)
    qm = QuantizedMatrix.quantize(torch.randn(16, 64), "q4_1")
    with pytest.raises(ValueError, match="features"):
        kernel_linear(torch.randn(2, 32), qm)
    with pytest.raises(ValueError, match="row indices"):
        qm.select_rows(torch.tensor([16]))
    with pytest.raises(ValueError, match="invalid weight format"):
        _C.small_gemm(0, 0, 0, 0, 1, 1, 32, 1, 10)
    with pytest.raises(ValueError, match="multiple of 32"):
        _C.quant_packed_bytes(2, 16, 48)
    with pytest.raises(ValueError, match="multiple of 256"):
        QuantizedMatrix(torch.zeros(10, dtype=torch.uint8), "q4_k", (16, 128))
    with pytest.raises(ValueError, match="cannot quantize to 'q6_k'"):
        QuantizedMatrix.quantize(torch.randn(4, 256), "q6_k")
    with pytest.raises(ValueError, match="in_features must be a positive multiple of 256"):
        _C.small_gemm(0, 0, 0, 0, 1, 1, 128, 1, 5)
    with pytest.raises(ValueError, match="n >= 1"):
        _C.quant_packed_bytes(2, -16, 64)
