"""The native extension: build info, kv_store kernel vs its torch reference."""
import pytest
import torch

from sonarspec_ext import _C, ops
from sonarspec_ext.testing.reference import kv_store_reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and _C.cuda_available() else [])


def test_build_info():
    info = _C.build_info()
    assert isinstance(info["cuda"], bool) and isinstance(info["version"], str)
    assert (info["cuda_arch"] is None) == (not info["cuda"])
    assert isinstance(_C.cuda_available(), bool)
    if not info["cuda"]:
        assert not _C.cuda_available()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,heads,dim", [(1, 1, 8), (7, 2, 3), (99, 4, 64)])
def test_kv_store_matches_reference(device, dtype, num_tokens, heads, dim):
    g = torch.Generator().manual_seed(num_tokens)
    num_slots = 2 * num_tokens + 5
    slots = torch.randperm(num_slots, generator=g)[:num_tokens]
    slots[0] = -1  # padding token: skipped
    k = torch.randn(num_tokens, heads, dim, generator=g).to(dtype)
    v = torch.randn(num_tokens, heads, dim, generator=g).to(dtype)
    pools = [torch.randn(num_slots, heads, dim, generator=g).to(dtype) for _ in range(2)]
    ref = [p.clone() for p in pools]
    kv_store_reference(ref[0], ref[1], k, v, slots)
    dev = [t.to(device) for t in (pools[0], pools[1], k, v, slots)]
    ops.kv_store(*dev)
    assert torch.equal(dev[0].cpu(), ref[0]) and torch.equal(dev[1].cpu(), ref[1])


def test_kv_store_rejects_bad_tensors():
    pool = torch.zeros(10, 2, 4)
    k = torch.zeros(3, 2, 4)
    slots = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="slot_mapping"):
        ops.kv_store(pool, pool.clone(), k, k, slots.int())
    with pytest.raises(ValueError, match="k has dtype"):
        ops.kv_store(pool, pool.clone(), k.half(), k, slots)
    with pytest.raises(ValueError, match="v must be contiguous"):
        ops.kv_store(pool, pool.clone(), k, torch.zeros(2, 3, 4).transpose(0, 1), slots)
    with pytest.raises(ValueError, match="k has shape"):
        ops.kv_store(pool, pool.clone(), torch.zeros(3, 2, 5), k, slots)
    with pytest.raises(ValueError, match="k_pool must have 3 dimensions"):
        ops.kv_store(pool[0], pool.clone(), k, k, slots)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 13), (99, 64), (1408, 512), (111, 1000)])
@pytest.mark.parametrize("bias", [False, True])
def test_padded_linear_matches_torch(m, n, k, bias):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    torch.testing.assert_close(ops.kernel_linear(x, w, b), torch.nn.functional.linear(x, w, b),
                               atol=1e-4 * k ** 0.5, rtol=1e-5)
    # leading dims are kept, and one-hot rows pick exact weight columns
    eye = torch.eye(k)[: min(k, 3)].reshape(1, -1, k)
    assert torch.equal(ops.kernel_linear(eye, w), w[:, : min(k, 3)].T.reshape(1, -1, n))


def test_padded_linear_keeps_autograd():
    x = torch.randn(2, 8, requires_grad=True)
    w = torch.randn(5, 8, requires_grad=True)
    ops.kernel_linear(x, w).sum().backward()
    torch.testing.assert_close(x.grad, w.sum(0).expand(2, 8))


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (64, 256), (65, 33)])
def test_rms_norm_and_silu_and_mul_match_torch(rows, n):
    from sonarspec_ext.ops.elementwise import rms_norm, silu_and_mul
    g = torch.Generator().manual_seed(rows * n)
    x, w = torch.randn(rows, n, generator=g) * 3, torch.randn(n, generator=g)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    torch.testing.assert_close(rms_norm(x, w, 1e-5), ref.float(), rtol=1e-5, atol=1e-5)
    xx = torch.randn(rows, 2 * n, generator=g) * 4
    gate, up = xx.double().chunk(2, dim=-1)
    torch.testing.assert_close(silu_and_mul(xx), (gate * torch.sigmoid(gate) * up).float(), rtol=1e-5, atol=1e-5)
    y = x.clone().requires_grad_(True)   # autograd keeps the torch path
    rms_norm(y, w, 1e-5).sum().backward()
    assert y.grad is not None


@pytest.mark.parametrize("rows,heads,d", [(1, 1, 2), (5, 6, 64), (64, 3, 10)])
def test_rope_matches_the_rotate_half_formula(rows, heads, d):
    from sonarspec_ext.ops.elementwise import apply_rope
    g = torch.Generator().manual_seed(rows + d)
    x = torch.randn(rows, heads, d, generator=g)
    angles = torch.randn(rows, 1, d // 2, generator=g).double()
    x1, x2 = x.double().chunk(2, dim=-1)
    ref = torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), dim=-1)
    torch.testing.assert_close(apply_rope(x, angles.cos().float(), angles.sin().float()), ref.float(),
                               rtol=1e-5, atol=1e-5)


def _matmul_input(x: torch.Tensor, weight_dtype: torch.dtype) -> torch.Tensor:
    """What a linear layer multiplies, in float64: bfloat16 weights take bfloat16-rounded
    activations (products exact, sums in float32 - within the tolerances below)."""
    return (x.bfloat16() if weight_dtype == torch.bfloat16 else x).double()


@pytest.mark.parametrize("m", [1, 5, 6, 7, 8, 40, 64, 65])
@pytest.mark.parametrize("k", [96, 256, 45])
def test_bf16_weights_take_bf16_rounded_activations_and_rows_stay_independent(m, k):
    """Compact (bfloat16) weights: the product of the bfloat16-rounded activations and the
    weights, summed in float32 (the float64 oracle), and each row equal bit for bit to the
    same row computed alone - what makes a verified token equal a decoded one."""
    from sonarspec_ext.ops.limits import COMPACT_MAX_ROWS
    from sonarspec_ext.ops.linear import kernel_linear
    g = torch.Generator().manual_seed(m)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(203, k, generator=g).bfloat16(), torch.randn(203, generator=g)
    got = kernel_linear(x, w, b)
    ref = _matmul_input(x, torch.bfloat16) @ w.double().T + b.double()
    torch.testing.assert_close(got, ref.float(), rtol=1e-5, atol=1e-4)
    assert (got.double() - ref).abs().max() < 0.1 * (x.double() @ w.double().T + b.double() - ref).abs().max()
    if m <= COMPACT_MAX_ROWS:
        for i in {0, m // 2, m - 1}:
            assert torch.equal(kernel_linear(x[i:i + 1], w, b)[0], got[i])


def test_compact_weights_decode_like_transformers_with_bf16_matmul_inputs(tmp_path):
    """A bfloat16 checkpoint keeps compact weights (norms widened). Teacher-forced along
    our greedy output, every token is the argmax of transformers in float32 with each
    linear layer's input rounded to bfloat16 (up to 1e-3 of the logit scale: a rounding
    that flips on a tiny upstream difference moves an activation by a bfloat16 step);
    float32 copies (``compact_weights=False``) match plain float32 transformers."""
    from helpers.models import hf_load, make_hf_model
    from sonarspec_ext import LLM, SamplingParams
    from sonarspec_ext.models.loader import load_model
    from sonarspec_ext.models.tokenizer import write_byte_tokenizer
    model = make_hf_model(str(tmp_path / "fp32"), "llama", seed=5)
    d = str(tmp_path / "bf16")
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    write_byte_tokenizer(d)
    compact = load_model(d)
    wide = load_model(d, compact_weights=False)
    assert compact.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    assert compact.model.norm.weight.dtype == torch.float32 and wide.lm_head.weight.dtype == torch.float32
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44, 45]]
    for model, oracle, tol in ((compact, hf_load(d, bf16_matmul_inputs=True), 1e-3), (wide, hf_load(d), 1e-5)):
        llm = LLM(d)
        llm.engine.model = llm.engine.runner.model = model    # before the first step builds the native stack
        for p, out in zip(prompts, llm.generate(prompts, params)):
            with torch.no_grad():
                logits = oracle(torch.tensor([p + out.token_ids])).logits[0, len(p) - 1:-1]
            chosen = logits.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
            assert (logits.max(-1).values - chosen).max() <= tol * logits.abs().max()


@pytest.mark.parametrize("m", [1, 9, 33, 64, 65, 70])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_padded_linear_awkward_shapes_and_non_contiguous_inputs(m, weight_dtype):
    from sonarspec_ext.ops.linear import kernel_linear
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 2 * 45, generator=g)[:, ::2]          # non-contiguous rows of 45
    w = torch.randn(77, 45, generator=g).to(weight_dtype)
    b = torch.randn(77, generator=g)
    ref = _matmul_input(x, weight_dtype) @ w.double().T + b.double()
    torch.testing.assert_close(kernel_linear(x, w, b), ref.float(), rtol=1e-5, atol=1e-4)
    x3 = torch.randn(2, m, 45, generator=g)                   # leading batch dims
    torch.testing.assert_close(kernel_linear(x3, w), (_matmul_input(x3, weight_dtype) @ w.double().T).float(),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", [1, 3, 8, 9, 33, 64, 65, 70])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_padded_mlp_matches_the_torch_mlp(m, weight_dtype):
    """The gated MLP against float64 torch (awkward sizes, non-contiguous input, leading
    dims), and bit for bit against the three-op composition it replaces."""
    from sonarspec_ext.ops import kernel_mlp
    from sonarspec_ext.ops.elementwise import silu_and_mul
    from sonarspec_ext.ops.linear import kernel_linear
    g = torch.Generator().manual_seed(m)
    H, inter = 45, 37
    x = torch.randn(m, 2 * H, generator=g)[:, ::2]
    gate_up = (torch.randn(2 * inter, H, generator=g) / 5).to(weight_dtype)
    down = (torch.randn(H, inter, generator=g) / 5).to(weight_dtype)
    gu = _matmul_input(x, weight_dtype) @ gate_up.double().T
    act = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).float()
    ref = _matmul_input(act, weight_dtype) @ down.double().T
    got = kernel_mlp(x, gate_up, down)
    torch.testing.assert_close(got, ref.float(), rtol=1e-5, atol=1e-5)
    assert torch.equal(got, kernel_linear(silu_and_mul(kernel_linear(x, gate_up)), down))
    x3 = x.reshape(1, m, H)
    assert torch.equal(kernel_mlp(x3, gate_up, down)[0], got)
    with pytest.raises(ValueError, match="gate_up_weight has shape"):
        kernel_mlp(x, gate_up[:-1], down)
    with pytest.raises(ValueError, match="features"):
        kernel_mlp(x[:, :-1], gate_up, down)
    with pytest.raises(ValueError, match="share a dtype"):
        kernel_mlp(x, gate_up.double(), down)



@pytest.mark.parametrize("env, probe", [("SONARSPEC_NO_BF16_DOT", "bf16_dot_available"),
                                        ("SONARSPEC_NO_AMX", "amx_available")])
def test_bf16_weight_kernels_without_amx_or_vdpbf16ps(env, probe):
    """CPUs without AMX (forced here with SONARSPEC_NO_AMX: the VDPBF16PS kernel) or
    without AVX512_BF16 (SONARSPEC_NO_BF16_DOT: the FMA fallback): the GEMM and MLP tests
    above pass there too - the same bfloat16-rounded activations, the float64 oracle's
    result, rows independent of each other."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, **{env: "1"})
    check = subprocess.run([sys.executable, "-c", f"from sonarspec_ext import _C; print(_C.{probe}())"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert check.stdout.strip() == "False", check.stderr[-2000:]
    tests = "bf16_weights_take or bf16_rows_agree or padded_linear_awkward or padded_mlp_matches"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", tests],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and " passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


_PREFETCH_SCRIPT = """
import json, torch
from sonarspec_ext import _C
from sonarspec_ext.ops.linear import kernel_linear
g = torch.Generator().manual_seed(5)
cases = [(torch.randn(m, k, generator=g), torch.randn(n, k, generator=g).bfloat16())
         for m, n, k in ((1, 203, 45), (5, 96, 64), (8, 64, 1536), (13, 37, 256))]
out = {"kernel": _C.bf16_dot_available()}
for mode in ("near", "far", "none"):
    _C.set_weight_prefetch(mode)
    out[mode] = [kernel_linear(x, w).view(torch.int32).flatten().tolist() for x, w in cases]
print(json.dumps(out))
"""


def test_vdpbf16ps_rows_are_the_same_bits_under_every_weight_prefetch():
    """The VDPBF16PS kernel (AMX off) computes the same bits whichever way it prefetches."""
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, SONARSPEC_NO_AMX="1")
    res = subprocess.run([sys.executable, "-c", _PREFETCH_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    if not out["kernel"]:
        pytest.skip("no AVX512_BF16 here: the FMA fallback does not prefetch")
    assert out["near"] == out["far"] == out["none"]


@pytest.mark.parametrize("n, k", [(96, 64), (203, 45), (64, 1536)])
def test_bf16_rows_agree_whatever_the_row_count(n, k):
    """Under inference every row count runs natively (on AMX tiles where the CPU has them:
    up to 16 rows in narrow tiles, more in groups of 16): a row's result is the same bits
    in a call of 1, 15, 16, 17, 33 or 100 rows, and a non-finite weight row spoils its own
    column only (the zero padding of awkward shapes multiplies nothing else)."""
    from sonarspec_ext.ops.linear import kernel_linear
    g = torch.Generator().manual_seed(n + k)
    x, w = torch.randn(100, k, generator=g), torch.randn(n, k, generator=g).bfloat16()
    w[7, -1] = float("inf")
    with torch.inference_mode():
        full = kernel_linear(x, w)
        for rows in (1, 15, 16, 17, 33):
            for start in (0, 100 - rows):
                assert torch.equal(kernel_linear(x[start:start + rows], w), full[start:start + rows])
    ref = _matmul_input(x, torch.bfloat16) @ w.double().T
    finite = torch.ones(n, dtype=torch.bool)
    finite[7] = False
    torch.testing.assert_close(full[:, finite], ref[:, finite].float(), rtol=1e-5, atol=1e-4)
    assert not full[:, 7].isfinite().any()
