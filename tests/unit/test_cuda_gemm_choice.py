"""ops.cuda_gemm_choice: each shape timed once and the faster GEMM kept; forced choices;
no timing while a graph is captured or for large row counts. The timer is replaced by
given times (the device timings run in tools/gpu_check.sh)."""
import pytest

from sonarspec_ext.ops import cuda_gemm_choice as cgc


@pytest.fixture
def fake_times(monkeypatch):
    times, calls = {}, []

    def median_ms(fn):
        calls.append(fn)
        return times[fn]
    monkeypatch.setattr(cgc, "_median_ms", median_ms)
    monkeypatch.setattr(cgc, "_chosen", {})
    monkeypatch.setattr(cgc.torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("SONARSPEC_CUDA_GEMM", raising=False)
    return times, calls


def test_the_faster_is_kept_per_shape(fake_times):
    times, calls = fake_times
    fast, slow = (lambda: "a"), (lambda: "b")
    times.update({fast: 1.0, slow: 2.0})
    assert cgc.choose((4, 64, 32), fast, slow) == "cutlass"
    assert cgc.choose((4, 64, 32), slow, fast) == "cutlass"   # kept: not timed again
    assert len(calls) == 2
    assert cgc.choose((8, 64, 32), slow, fast) == "torch"
    assert cgc.chosen() == {(4, 64, 32): "cutlass", (8, 64, 32): "torch"}


def test_forced_large_and_captured_shapes_are_not_timed(fake_times, monkeypatch):
    times, calls = fake_times
    f = lambda: None  # noqa: E731
    assert cgc.choose((cgc.TUNE_MAX_ROWS + 1, 64, 32), f, f) == "torch"
    monkeypatch.setattr(cgc.torch.cuda, "is_current_stream_capturing", lambda: True)
    assert cgc.choose((3, 64, 32), f, f) == "torch" and cgc.chosen() == {}
    monkeypatch.setenv("SONARSPEC_CUDA_GEMM", "cutlass")
    assert cgc.choose((3, 64, 32), f, f) == "cutlass"
    monkeypatch.setenv("SONARSPEC_CUDA_GEMM", "cublas")
    with pytest.raises(ValueError, match="SONARSPEC_CUDA_GEMM must be one of auto, cutlass, torch"):
        cgc.choose((3, 64, 32), f, f)
    assert calls == []
