"""Recording every step's proposals with native drafting on or off (the per-op path)."""
import sonarspec_ext.spec.chains as chains_mod
from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.runtime.runner import ModelRunner
from sonarspec_ext.spec.chains import native_chains

REAL_NATIVE_ROWS = ModelRunner._native_rows
REAL_REFILL_CHAIN = ModelRunner.refill_chain

PROMPTS = [[5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48], [9] * 5, [100, 101]]
PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def record_drafts(model, spec, prompts, native: bool, monkeypatch, params=PARAMS):
    """Every step's proposed chains, and the outputs; ``native`` False: no native chains,
    no native row forwards and no native refill-and-chain calls (the per-op path)."""
    monkeypatch.setattr(chains_mod, "native_chains", native_chains if native else (lambda *a, **k: None))
    monkeypatch.setattr(ModelRunner, "_native_rows", REAL_NATIVE_ROWS if native else (lambda *a, **k: None))
    monkeypatch.setattr(ModelRunner, "refill_chain", REAL_REFILL_CHAIN if native else (lambda *a, **k: None))
    llm = LLM(model, spec=spec)
    proposer, seen, used = llm.engine.proposer, [], []
    proposer.device_chain = native   # off: every round on its own (the per-op path)
    real = proposer.propose

    def recording(seqs, ks):
        out = real(seqs, ks)
        seen.append([d.token_ids for d in out])
        return out
    proposer.propose = recording
    if native:
        real_chains = native_chains

        def counting(*a, **k):
            out = real_chains(*a, **k)
            used.append(out is not None)
            return out
        monkeypatch.setattr(chains_mod, "native_chains", counting)

        def counting_refills(*a, **k):
            out = REAL_REFILL_CHAIN(*a, **k)
            used.append(out is not None)
            return out
        monkeypatch.setattr(ModelRunner, "refill_chain", counting_refills)
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    return seen, outs, used
