"""Threads: the native kernels' worker pool and torch's own threads inside an engine step."""
import torch

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.ops.linear import native_threads


def test_worker_polling_time_does_not_change_results():
    """Workers that sleep between calls (polling time 0: every call wakes them) and workers
    that poll give the same multi-threaded GEMM, bit for bit, and the setting reads back."""
    from sonarspec_ext import _C
    from sonarspec_ext.ops.linear import native_gemm_threads, kernel_linear
    torch.manual_seed(0)
    x, w = torch.randn(4, 512), torch.randn(2048, 512)   # big enough to use two threads
    before = _C.worker_spin_us()
    try:
        outs = []
        for spin in (0, 5000, -3):
            _C.set_worker_spin_us(spin)
            assert _C.worker_spin_us() == max(spin, 0)
            with torch.inference_mode(), native_gemm_threads():
                outs.append([kernel_linear(x, w) for _ in range(20)])
    finally:
        _C.set_worker_spin_us(before)
    ref = (x.double() @ w.double().T).float()
    for run in outs:
        for y in run:
            assert torch.equal(y, outs[0][0])
    torch.testing.assert_close(outs[0][0], ref, rtol=1e-5, atol=1e-4)


def test_an_engine_step_runs_torch_single_threaded_and_native_kernels_on_all_threads(llama_dir, draft_dir,
                                                                                     monkeypatch):
    """Inside a step torch's ops run on one thread (its OpenMP workers, spinning after a
    parallel region, would hold the cores the native kernels' workers need), the native
    kernels get torch's thread count - float32 CPU steps of every size, a 200-token prefill
    chunk included, run natively - and afterwards torch's count is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=4),
                  max_num_batched_tokens=512)
        eng = llm.engine
        seen = {"propose": set(), "forward": set()}
        propose = eng.proposer.propose

        def spy_propose(seqs, ks):
            seen["propose"].add((torch.get_num_threads(), native_threads()))
            return propose(seqs, ks)
        monkeypatch.setattr(eng.proposer, "propose", spy_propose)
        import sonarspec_ext.runtime.runner as runner_mod
        real_stack, real_forward = runner_mod.run_native_stack, type(eng.model).forward

        def spy_stack(stack, model, input_ids, *args, **kwargs):
            out = real_stack(stack, model, input_ids, *args, **kwargs)
            if model is eng.model:
                seen["forward"].add((input_ids.numel(), torch.get_num_threads(), out is not None))
            return out

        def spy_forward(self, input_ids, *args, **kwargs):   # the per-op path
            if self is eng.model:
                seen["forward"].add((input_ids.numel(), torch.get_num_threads(), False))
            return real_forward(self, input_ids, *args, **kwargs)
        monkeypatch.setattr(runner_mod, "run_native_stack", spy_stack)
        monkeypatch.setattr(type(eng.model), "forward", spy_forward)
        long_prompt = list(range(5, 205))   # 200 tokens: prefilled natively too, in slices
        out = llm.generate([long_prompt, "def f(x):"], SamplingParams(max_tokens=12, ignore_eos=True))
        assert all(len(o.token_ids) == 12 for o in out)
        assert seen["propose"] == {(1, 2)}
        assert {(t, native) for _, t, native in seen["forward"]} == {(1, True)}   # every target step natively
        assert max(n for n, _, _ in seen["forward"]) >= 200
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
