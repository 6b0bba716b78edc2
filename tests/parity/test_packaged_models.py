"""The packaged default models: present, loadable by transformers, equal to sonarspec."""
import json
import os

import torch

from sonarspec_ext import LLM, SamplingParams, SpecConfig, assets
from sonarspec_ext.models.tokenizer import Tokenizer

PROMPT = "def parse_args(argv):\n"


def test_assets_resolve_and_fit_the_size_budget():
    total = 0
    for name in ("target", "draft"):
        d = assets.path(name)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json", "training.json"):
            assert os.path.isfile(os.path.join(d, f)), f"{name}/{f}"
        total += sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        info = json.load(open(os.path.join(d, "training.json")))
        assert info["tokens_seen"] > 0 and info["val_loss"] < 4.5  # uniform guessing: ln(8192) = 9.0
    assert total <= 60 * 2 ** 20
    target, draft = (Tokenizer.from_dir(assets.path(n)) for n in ("target", "draft"))
    assert target.fingerprint() == draft.fingerprint()


def test_packaged_target_matches_transformers():
    """The packaged (bfloat16) target keeps compact weights: transformers in float32 with
    every linear layer's input rounded to bfloat16 is the oracle, greedy tokens and
    logits; float32 copies of the weights match plain float32 transformers."""
    import transformers
    from helpers.models import hf_load
    from sonarspec_ext.layers.attention import DenseCausalAttention
    from sonarspec_ext.models.loader import load_model
    d = assets.path("target")
    hf = hf_load(d, bf16_matmul_inputs=True)
    tok = transformers.AutoTokenizer.from_pretrained(d)
    llm = LLM("default")
    ids = tok(PROMPT)["input_ids"]
    assert ids == llm.tokenizer.encode(PROMPT)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=32, do_sample=False, pad_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        ref_logits = hf(torch.tensor([ids + ref])).logits[0]
    out = llm.generate(PROMPT, SamplingParams(max_tokens=32, temperature=0.0))[0]
    assert out.token_ids == ref[:len(out.token_ids)]
    assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
    x = torch.tensor(ids + ref)
    wide = load_model(d, compact_weights=False)
    with torch.no_grad():
        logits = {name: model.compute_logits(model(x, torch.arange(len(x)), DenseCausalAttention(1, len(x))))
                  for name, model in (("compact", llm.engine.model), ("wide", wide))}
        torch.testing.assert_close(logits["wide"], hf_load(d)(x[None]).logits[0], atol=1e-4, rtol=1e-4)
    # A bfloat16 rounding that flips on a 1e-6 difference upstream moves an activation by
    # one bfloat16 step (2^-8 relative); over 8 layers such flips reach the logits
    # (magnitude ~10) as differences of ~0.02 (measured).
    torch.testing.assert_close(logits["compact"], ref_logits, atol=0.1, rtol=0)
    assert (logits["compact"] - ref_logits).abs().mean() < 0.01


def test_default_draft_target_is_lossless_and_accepts_drafts():
    params = SamplingParams(max_tokens=48, temperature=0.0)
    plain = LLM("default").generate(PROMPT, params)[0]
    llm = LLM("default", spec=SpecConfig(method="draft_target", draft="default", num_draft_tokens=4))
    out = llm.generate(PROMPT, params)[0]
    assert out.token_ids == plain.token_ids
    assert llm.stats()["acceptance_length"] > 1.5  # trained draft and target agree often


def test_default_mtp_head_is_lossless_and_accepts_drafts():
    d = assets.path("mtp")
    info = json.load(open(os.path.join(d, "training.json")))
    assert info["engine_validation"]["equal_to_plain_decoding"]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    prompts = [PROMPT, "class Stack:\n    def push(self, item):\n"]
    plain = [o.token_ids for o in LLM("default").generate(prompts, params)]
    for k in (1, 3):
        llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=k))
        assert [o.token_ids for o in llm.generate(prompts, params)] == plain
        assert llm.stats()["accepted_per_position"][0] > 0.5   # a trained head agrees with its target often
