"""Recording every step's proposals with native drafting on or off (the per-op path); draft
models sharing their target's embedding."""
import os
import shutil

import torch

import sonarspec_ext.spec.chains as chains_mod
from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.models.config import ModelConfig
from sonarspec_ext.models.draft_llm import save_draft_model
from sonarspec_ext.models.llama import LlamaForCausalLM
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


def shared_draft_model(target_dir: str, path: str, vocab=None, seed: int = 0) -> str:
    """A random one-layer draft of ``target_dir``'s width saved without embedding and lm_head
    (its target's, bound at load), proposing from ``vocab`` (None: every token)."""
    torch.manual_seed(seed)
    cfg = ModelConfig.from_dir(target_dir)
    cfg.num_hidden_layers = 1
    model = LlamaForCausalLM(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.15)
    save_draft_model(model, path, vocab, dtype="float32")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(target_dir, f), path)
    return path
