"""The CUTLASS 64-row-tile GEMM behind ``ops.kernel_linear`` on CUDA (bfloat16 / float16):
against float64 torch, row for row independent of how many rows share the tile, shapes it
does not take falling back to ``F.linear``. GPU tests skip without a CUDA device and a
build with the kernel (``tools/gpu_check.sh`` runs them on a GPU machine)."""
import pytest
import torch

from sonarspec_ext import _C
from sonarspec_ext.ops import kernel_linear, kernel_mlp
from sonarspec_ext.ops.checks import built_with_cuda, built_with_cutlass
from sonarspec_ext.ops.elementwise import silu_and_mul
from sonarspec_ext.ops.linear import _cutlass_linear

GPU = torch.cuda.is_available() and _C.cuda_available() and built_with_cutlass()
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA device and the CUTLASS GEMM in the build")


@pytest.fixture(autouse=True)
def _cutlass_forced(monkeypatch):
    """These tests are about the CUTLASS kernel: kernel_linear takes it for every shape
    it accepts instead of the measured choice (ops.cuda_gemm_choice)."""
    monkeypatch.setenv("SONARSPEC_CUDA_GEMM", "cutlass")


def test_build_reports_the_kernel_only_with_cuda():
    assert isinstance(built_with_cutlass(), bool)
    assert not built_with_cutlass() or built_with_cuda()


def _operands(m, n, k, dtype, seed, bias=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=g).to(dtype) if bias else None
    return x, w, b


@needs_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 7, 63, 64, 65, 130])
@pytest.mark.parametrize("n,k,bias", [(256, 128, False), (1000, 264, True), (4096, 4096, True)])
def test_matches_float64_torch(dtype, m, n, k, bias):
    x, w, b = _operands(m, n, k, dtype, seed=m + n)
    got = _cutlass_linear(x, w, b)
    assert got is not None, "the CUTLASS path must take this shape"
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    # one rounding of the float32 accumulator to the 16-bit output (bf16: 2^-8 relative)
    tol = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    assert torch.equal(kernel_linear(x, w, b), got)


@needs_gpu
@pytest.mark.cuda
def test_a_row_does_not_depend_on_the_rows_sharing_its_tile():
    """Batch invariance: a token's output is the same bits whether it is decoded alone or
    verified among 63 others (the k-loop order does not depend on m)."""
    x, w, b = _operands(64, 512, 256, torch.bfloat16, seed=3)
    full = kernel_linear(x, w, b)
    for m in (1, 5, 17):
        assert torch.equal(kernel_linear(x[:m], w, b), full[:m])


@needs_gpu
@pytest.mark.cuda
def test_unsupported_shapes_fall_back_and_mlp_composes():
    x, w, b = _operands(9, 77, 45, torch.bfloat16, seed=5)      # k, n not multiples of 8
    assert _cutlass_linear(x, w, b) is None
    torch.testing.assert_close(kernel_linear(x, w, b), torch.nn.functional.linear(x, w, b))
    x, gate_up, _ = _operands(12, 2 * 96, 64, torch.bfloat16, seed=6, bias=False)
    down = _operands(1, 64, 96, torch.bfloat16, seed=7, bias=False)[1]
    want = kernel_linear(silu_and_mul(kernel_linear(x, gate_up)), down)
    assert torch.equal(kernel_mlp(x, gate_up, down), want)
    x3 = x.view(3, 4, 64)                                       # leading dims
    assert torch.equal(kernel_linear(x3, gate_up).view(12, -1), kernel_linear(x, gate_up))
