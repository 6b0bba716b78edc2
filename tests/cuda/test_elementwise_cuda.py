"""The decoder layer's small ops on CUDA (ops.elementwise; tools/gpu_check.sh runs these
on a GPU machine, skipped elsewhere): RMSNorm, SiLU-and-multiply and RoPE on the fused
q/k/v rows against float64 references of the same formulas, in float32, float16 and
bfloat16; a row's result the same bits alone or among others."""
import pytest
import torch

from sonarspec_ext.ops.elementwise import apply_rope, rms_norm, rope_qkv, silu_and_mul

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# ||out - ref|| / ||ref||: float32 arithmetic; 16-bit outputs rounded once or twice
TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _rel(out, ref):
    return float((out.double().cpu() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,n", [(1, 576), (7, 4096), (64, 1000), (3, 17)])
def test_rms_norm(dtype, rows, n):
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = (torch.randn(rows, n, device="cuda", generator=g) * 3).to(dtype)
    w = torch.randn(n, device="cuda", generator=g).to(dtype)
    out = rms_norm(x, w, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    x64 = x.double().cpu()
    normed = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype).double()
    assert _rel(out, w.double().cpu() * normed) < TOL[dtype]
    assert torch.equal(rms_norm(x[2:3] if rows > 2 else x[:1], w, 1e-5), out[2:3] if rows > 2 else out[:1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,n", [(1, 1536), (9, 14336), (33, 5)])
def test_silu_and_mul(dtype, rows, n):
    g = torch.Generator(device="cuda").manual_seed(rows * n)
    x = (torch.randn(rows, 2 * n, device="cuda", generator=g) * 2).to(dtype)
    out = silu_and_mul(x)
    gate, up = x.double().cpu().chunk(2, dim=-1)
    assert out.shape == (rows, n) and _rel(out, torch.nn.functional.silu(gate) * up) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,heads,kv_heads,d,pad", [(1, 32, 8, 128, 0), (5, 9, 3, 64, 0), (17, 4, 4, 32, 24)])
def test_rope_qkv(dtype, n, heads, kv_heads, d, pad):
    g = torch.Generator(device="cuda").manual_seed(n + heads + d)
    width = (heads + 2 * kv_heads) * d
    wide = torch.randn(n, width + pad, device="cuda", generator=g).to(dtype)
    qkv = wide[:, :width]                              # rows with a stride past their width (pad > 0)
    angles = torch.rand(n, 1, d // 2, device="cuda", generator=g) * 6.3
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    q, k, v = rope_qkv(qkv, cos, sin, heads, kv_heads, d)
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    q64, k64, v64 = qkv.double().cpu().split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    ref = apply_rope(torch.cat([q64.view(n, heads, d), k64.view(n, kv_heads, d)], 1), cos.double().cpu(),
                     sin.double().cpu())
    assert _rel(torch.cat([q, k], 1), ref) < TOL[dtype]
    assert torch.equal(v.cpu(), v64.view(n, kv_heads, d).to(dtype))
    assert rope_qkv(qkv.cpu(), cos.cpu(), sin.cpu(), heads, kv_heads, d) is None   # CPU: the torch path
