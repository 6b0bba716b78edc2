"""Incremental detokenization against decoding the whole output: the same text whenever the
whole output ends on a complete character (a prefix of it otherwise), on byte-level BPE
(SmolLM2's GGUF tokenizer, the packaged one) with random tokens that split multi-byte
characters; and the engine decodes a bounded tail per token, not the whole output."""
import random

import pytest

from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.engine.detokenize import IncrementalText


def _tokenizers():
    from sonarspec_ext.models.loader import load_tokenizer
    out = [("packaged", load_tokenizer(__import__("sonarspec_ext.assets", fromlist=["resolve"]).resolve("default",
                                                                                                          "target")))]
    try:
        out.append(("smollm2", load_tokenizer("smollm2")))
    except (FileNotFoundError, ValueError):
        pass
    return out


@pytest.mark.parametrize("name,tok", _tokenizers(), ids=lambda x: x if isinstance(x, str) else "")
def test_incremental_text_equals_decoding_everything(name, tok):
    rng = random.Random(0)
    vocab = tok.vocab_size
    texts = ["naïve café — 数学 🙂 déjà vu", "def f(x):\n    return x ** 2  # ok", "  spaces   and\ttabs"]
    for trial in range(30):
        if trial < len(texts):
            ids = tok.encode(texts[trial])
        else:
            ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        inc = IncrementalText(tok)
        for n in range(1, len(ids) + 1):
            got, full = inc.update(ids[:n]), tok.decode(ids[:n])
            if full.endswith("\ufffd"):
                assert full.startswith(got)
            else:
                assert got == full, (name, ids[:n])


def test_the_engine_decodes_a_bounded_tail_per_token():
    llm = LLM("default")
    lengths = []
    decode = llm.engine.tokenizer.decode
    llm.engine.tokenizer.decode = lambda ids: lengths.append(len(ids)) or decode(ids)
    params = SamplingParams(max_tokens=200, temperature=0.8, seed=3, ignore_eos=True, stop=["\x00never"])
    out = llm.generate(["def main():"], params)[0]
    assert len(out.token_ids) == 200 and out.text == decode(out.token_ids)
    assert max(lengths[:-1]) <= 8        # the last call is the final full decode
