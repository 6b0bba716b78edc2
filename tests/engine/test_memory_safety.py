"""Reproducers of memory-safety defects in the public ops: out-of-range indices, meta
tensors, shape mismatches, large query/KV groups and concurrent callers. Each ran into
the C++ kernels unchecked (heap corruption, SIGSEGV or garbage); each must now either
match the torch reference or raise ValueError. The crash-prone calls run in a fresh
interpreter, so a regression fails one test instead of killing the run."""
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import torch.nn.functional as F

from helpers.models import make_hf_model
from helpers.parity import paged_logits
from sonarspec_ext import ops
from sonarspec_ext.models.loader import load_model


def run_isolated(code: str) -> str:
    """Runs ``code`` in a new interpreter; it must exit cleanly (no signal, no abort)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
    return r.stdout


PRELUDE = """
import torch
from sonarspec_ext import ops
def refused(fn):
    try:
        fn()
    except ValueError as e:
        print("ValueError:", e)
        return
    raise SystemExit("no ValueError")
"""


def test_shifted_scatter_block_ranges_outside_the_buffer():
    out = run_isolated(PRELUDE + """
ids = torch.arange(10)
one = torch.tensor([1])
refused(lambda: ops.shifted_scatter(ids, torch.tensor([9]), torch.tensor([4000]), one, torch.tensor([3999])))
refused(lambda: ops.shifted_scatter(ids, torch.tensor([8]), torch.tensor([5]), one, torch.tensor([0])))
refused(lambda: ops.shifted_scatter(ids, torch.tensor([1 << 40]), torch.tensor([2]), one, torch.tensor([0])))
refused(lambda: ops.shifted_scatter(ids, torch.tensor([-1]), torch.tensor([2]), one, torch.tensor([0])))
print("ok", ops.shifted_scatter(ids, torch.tensor([8]), torch.tensor([2]), torch.tensor([77]),
                                torch.tensor([0])).tolist())
""")
    assert out.count("ValueError:") == 4 and "outside input_ids' 10 tokens" in out
    assert "ok [0, 1, 2, 3, 4, 5, 6, 7, 77, 77]" in out


def test_paged_attention_indices_outside_the_tables():
    out = run_isolated(PRELUDE + """
q = torch.randn(1, 4, 16); kp = torch.randn(16, 2, 16)
table = torch.tensor([[0, 1]])
args = lambda seq, table=table, end=5: (q, kp, kp.clone(), table, 4, torch.tensor([seq]), torch.tensor([0]),
                                        torch.tensor([end]), 0.25)
refused(lambda: ops.paged_attention(*args(1 << 40)))
refused(lambda: ops.paged_attention(*args(1)))        # just past the table's one row
refused(lambda: ops.paged_attention(*args(-1)))
refused(lambda: ops.paged_attention(*args(0, torch.tensor([[1 << 50, 1 << 60]]))))   # page ids past the pool
print("ok", tuple(ops.paged_attention(*args(0)).shape))
""")
    assert out.count("ValueError:") == 4 and "ok (1, 64)" in out


def test_padded_linear_bias_shapes_follow_f_linear():
    out = run_isolated("""
import torch, torch.nn.functional as F
from sonarspec_ext import ops
x = torch.randn(1, 16)
for n in (128, 1 << 20):
    w = torch.randn(n, 16)
    torch.testing.assert_close(ops.kernel_linear(x, w, torch.zeros(1)), F.linear(x, w, torch.zeros(1)))
print("ok")
""")
    assert "ok" in out
    with pytest.raises(RuntimeError):   # F.linear's own refusal of a bias that does not broadcast
        ops.kernel_linear(torch.randn(2, 16), torch.randn(8, 16), torch.zeros(3))


def test_meta_tensors_are_refused_by_every_raw_pointer_op():
    out = run_isolated(PRELUDE + """
m = lambda *s, dt=torch.float32: torch.empty(*s, dtype=dt, device="meta")
i64 = lambda *s: m(*s, dt=torch.int64)
refused(lambda: ops.shifted_scatter(i64(4), i64(1), i64(1), i64(1), i64(1)))
refused(lambda: ops.kv_store(m(8, 1, 4), m(8, 1, 4), m(2, 1, 4), m(2, 1, 4), i64(2)))
refused(lambda: ops.paged_attention(m(1, 2, 4), m(8, 1, 4), m(8, 1, 4), i64(1, 2), 4, i64(1), i64(1), i64(1), 0.5))
refused(lambda: ops.chain_speculative_sampling(m(1, 2, 8), i64(1, 2), m(1, 3, 8)))
refused(lambda: ops.tree_speculative_sampling(m(1, 3, 8), i64(1, 3), i64(1, 3), m(1, 4, 8)))
# CPU activations with meta weights: torch's own ops answer, nothing native runs
from sonarspec_ext.ops.elementwise import rms_norm
x = torch.randn(2, 8)
for call, shape in ((lambda: rms_norm(x, m(8), 1e-6), (2, 8)), (lambda: ops.kernel_mlp(x, m(12, 8), m(8, 6)), (2, 8)),
                    (lambda: ops.kernel_linear(x, m(4, 8)), (2, 4))):
    try:
        assert tuple(call().shape) == shape
    except (RuntimeError, ValueError):   # torch's own refusal of mixed devices
        pass
print("meta weights ok")
""")
    assert out.count("ValueError:") == 5 and "meta weights ok" in out, out


def test_query_groups_above_sixteen_match_transformers(tmp_path):
    """32 query heads per KV head through the native decoder stack (CPU float32)."""
    from helpers.models import hf_load
    d = str(tmp_path / "g32")
    make_hf_model(d, "llama", seed=7, hidden_size=256, num_attention_heads=32, num_key_value_heads=1,
                  intermediate_size=128)
    model, hf = load_model(d), hf_load(d)
    prompts, conts = [[3, 14, 15, 92, 65, 35], [8, 9]], [[89, 79, 32], [3, 2, 1]]
    for native in (False, True):
        for p, c, o in zip(prompts, conts, paged_logits(model, prompts, conts, 4, native=native)):
            with torch.no_grad():
                ref = hf(torch.tensor([p + c])).logits[0]
            torch.testing.assert_close(o, ref, atol=1e-4, rtol=1e-4)


def test_native_gemm_from_several_python_threads():
    """Concurrent callers of the native thread pool get their own results."""
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(512, 256, generator=g) for _ in range(4)]
    xs = [torch.randn(4, 256, generator=g) for _ in range(4)]
    ref = [F.linear(x, w) for x, w in zip(xs, ws)]
    errors = []

    def work(i):
        for _ in range(200):
            out = ops.kernel_linear(xs[i], ws[i])
            if not torch.allclose(out, ref[i], atol=1e-3, rtol=1e-4):
                errors.append(i)
                return
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert not errors
