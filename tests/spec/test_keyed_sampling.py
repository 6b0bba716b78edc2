"""Seeded sampling under speculation: uniforms keyed by (seed, output position), coupled
verification against position-by-position inverse-CDF draws, and a seeded request's
tokens equal to plain decoding's with that seed - for every scheme, alone or in a mixed
batch, with or without the load control."""
import numpy as np
import pytest
import torch

from helpers.prompts import prompts
from helpers.stats import assert_matches
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.sampling.uniforms import KeyedUniforms, keyed_uniforms
from sonarspec_ext.spec.proposer import Draft
from sonarspec_ext.spec.tree import DraftTree
from sonarspec_ext.spec.verify import verify_chain, verify_chain_device, verify_chains, verify_tree
from sonarspec_ext.testing.reference import processed_probs_reference


def test_keyed_uniforms_are_a_function_of_seed_and_position():
    whole = keyed_uniforms(7, 0, 1000)
    assert torch.equal(torch.cat([keyed_uniforms(7, 0, 300), keyed_uniforms(7, 300, 700)]), whole)
    assert torch.equal(KeyedUniforms(7, 250).uniforms(50, 10), whole[300:310])
    assert not torch.equal(keyed_uniforms(8, 0, 1000), whole)
    assert torch.equal(keyed_uniforms(-1, 5, 20), keyed_uniforms(2**64 - 1, 5, 20))   # the same 64 bits
    assert whole.dtype == torch.float64 and 0 <= float(whole.min()) and float(whole.max()) < 1
    with pytest.raises(ValueError):
        keyed_uniforms(7, -1, 3)


class SplitMix64:
    """The published generator (Steele, Lea and Flood 2014; Vigna's splitmix64.c)."""
    def __init__(self, state):
        self.state = state & (2**64 - 1)

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        return z ^ (z >> 31)


def test_keyed_uniforms_are_splitmix64_streams():
    """Position j of seed s is output j + 1 of SplitMix64 started at the first output of
    SplitMix64 started at s, as a 53-bit fraction: the same numbers on every machine."""
    assert SplitMix64(0).next() == 0xE220A8397B1DCDAF   # the reference implementation's first output
    for seed in (0, 1, -5, 2**63 - 1):
        stream = SplitMix64(SplitMix64(seed).next())
        want = [(stream.next() >> 11) / 2**53 for _ in range(6)]
        assert keyed_uniforms(seed, 0, 6).tolist() == want


def test_keyed_uniforms_are_uniform_and_uncorrelated():
    """20 seeds x 1000 positions: 20 equal bins (chi-square, significance 0.001); lag-1
    correlation along positions and correlation between neighbouring seeds within 4
    standard errors of zero."""
    u = torch.stack([keyed_uniforms(s, 0, 1000) for s in range(20)])
    counts = torch.bincount((u.flatten() * 20).long(), minlength=20)
    assert_matches(counts, torch.full((20,), 1 / 20, dtype=torch.float64), "keyed uniforms", min_df=19)
    x = u.numpy()
    lag = np.corrcoef(x[:, :-1].ravel(), x[:, 1:].ravel())[0, 1]
    seeds = np.corrcoef(x[:-1].ravel(), x[1:].ravel())[0, 1]
    assert abs(lag) < 4 / np.sqrt(x[:, 1:].size) and abs(seeds) < 4 / np.sqrt(x[1:].size)


def _oracle_draws(logits, params, seed, position):
    """The target's draw at each row: the first index whose float64 running sum of the
    reference processed distribution exceeds the keyed uniform times the total."""
    probs = processed_probs_reference(logits, params.temperature, params.top_k, params.top_p).double().numpy()
    u = keyed_uniforms(seed, position, logits.shape[0]).numpy()
    cum = np.cumsum(probs, axis=1)
    return [int(np.argmax(c > x * c[-1])) for c, x in zip(cum, u)]


def test_coupled_chain_verification_accepts_drafts_equal_to_the_targets_keyed_draws():
    g = torch.Generator().manual_seed(0)
    items, want = [], []
    for i in range(60):
        k, V = i % 5, 64
        logits = torch.randn(k + 1, V, generator=g) * 2.5
        params = SamplingParams(temperature=[0.6, 1.0, 1.4][i % 3], top_k=[0, 10][i % 2], top_p=[1.0, 0.9][i % 4 // 2],
                                seed=i)
        draws = _oracle_draws(logits, params, i, 7 * i)
        ids = list(draws[:k])
        if k and i % 3 == 0:   # a wrong draft somewhere in the chain
            j = i % k
            ids[j] = (ids[j] + 1) % V
        a = next((j for j in range(k) if ids[j] != draws[j]), k)
        want.append((draws[:a + 1], a))
        probs = (torch.randn(k, V, generator=g) * 2).softmax(-1) if i % 2 else None   # ignored when coupled
        items.append((logits, Draft(ids, probs), params, KeyedUniforms(i, 7 * i)))
    assert verify_chains(items) == want
    assert [verify_chain(*it) for it in items] == want
    for (logits, draft, params, src), (tokens, a) in zip(items, want):
        t, acc = verify_chain_device(logits, torch.tensor(draft.token_ids, dtype=torch.long), draft.probs, params, src)
        assert int(acc) == a and t[:a + 1].tolist() == tokens
    assert {a for _, a in want} >= {0, 1, 2, 3, 4}


def test_coupled_tree_verification_follows_the_keyed_draw_at_each_depth():
    #        0
    #     1  2  3
    #    4 5    6
    #    7
    parents = [-1, 0, 0, 0, 1, 1, 3, 4]
    g = torch.Generator().manual_seed(1)
    seen = set()
    for trial in range(200):
        V = 6
        logits = torch.randn(len(parents), V, generator=g) * 2
        params = SamplingParams(temperature=1.0, seed=trial)
        tokens = [0] + torch.randint(0, V, (len(parents) - 1,), generator=g).tolist()
        for siblings in ([1, 2, 3], [4, 5]):   # children of a node are distinct tokens
            if len({tokens[c] for c in siblings}) < len(siblings):
                for j, c in enumerate(siblings):
                    tokens[c] = (tokens[siblings[0]] + j) % V
        tree = DraftTree(tokens, parents)
        src = KeyedUniforms(trial, 3)
        node, want, path = 0, [], []
        while True:   # the oracle walk: the draw at depth d uses the keyed uniform of position 3 + d
            tok = _oracle_draws(logits[node:node + 1], params, trial, 3 + len(path))[0]
            want.append(tok)
            child = next((c for c in range(len(parents)) if parents[c] == node and tokens[c] == tok), None)
            if child is None:
                break
            path.append(child)
            node = child
        assert verify_tree(logits, Draft(tokens[1:], tree=tree), params, src) == (want, path)
        seen.add(len(path))
    assert seen >= {0, 1, 2}


SCHEMES = {
    "mtp_chain": lambda heads, draft_dir: SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=3),
    "mtp_single_token": lambda heads, draft_dir: SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=1),
    "eagle_tree": lambda heads, draft_dir: SpecConfig(method="eagle_tree", draft=heads["trained"]),
    "draft_target": lambda heads, draft_dir: SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3),
    "ngram": lambda heads, draft_dir: SpecConfig(method="ngram", num_draft_tokens=3),
}


def _seeded_params(n):
    return [SamplingParams(max_tokens=20, temperature=[0.5, 0.8, 1.0][i % 3], top_k=[0, 8][i % 2],
                           top_p=[1.0, 0.9][i % 4 // 2], seed=100 + i, ignore_eos=True,
                           repetition_penalty=1.3 if i == 3 else 1.0) for i in range(n)]


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_seeded_tokens_equal_plain_decoding_with_that_seed(llama_dir, draft_dir, heads, scheme):
    """The oracle is plain decoding with the same seeds; the speculative engine runs the
    seeded requests alone, in a batch with greedy and unseeded requests, and under the
    adaptive load control (timing-driven draft lengths)."""
    ps, params = prompts(6, seed=61), _seeded_params(6)
    want = [o.token_ids for o in LLM(llama_dir).generate(ps, params)]
    spec = SCHEMES[scheme](heads, draft_dir)
    llm = LLM(llama_dir, spec=spec)
    others = prompts(4, seed=62)
    mixed = llm.generate(others[:2] + ps + others[2:],
                         [SamplingParams(max_tokens=30, ignore_eos=True), SamplingParams(max_tokens=9, temperature=1.0)]
                         + params + [SamplingParams(max_tokens=15, temperature=0.7), SamplingParams(max_tokens=3)])
    assert [o.token_ids for o in mixed[2:8]] == want
    assert llm.generate(ps[4], params[4])[0].token_ids == want[4]
    assert llm.stats()["num_draft_tokens"] > 0
    adaptive = LLM(llama_dir, spec=spec, adaptive_speculation=True)
    assert [o.token_ids for o in adaptive.generate(ps, params)] == want


def test_seeded_speculative_sampling_follows_the_target_law(llama_dir, heads):
    """Coupled verification keeps the law (chi-square against the exact law, as the
    unseeded rejection-sampling tests do), with drafts accepted."""
    from helpers.spec_checks import check_sampled_law
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=2), max_num_seqs=256)
    assert check_sampled_law(llm, llama_dir, 0.8, 0, 1.0, seeded=True)["num_accepted_tokens"] > 0


def test_seeded_tokens_survive_preemption(llama_dir, heads):
    """Under KV pressure (requests preempted and recomputed mid-output) the seeded
    requests still get plain decoding's tokens."""
    ps, params = prompts(8, seed=63), _seeded_params(8)
    want = [o.token_ids for o in LLM(llama_dir).generate(ps, params)]
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=2),
              num_pages=40, page_size=4, max_num_seqs=8)
    assert [o.token_ids for o in llm.generate(ps, params)] == want
    assert llm.stats()["num_preemptions"] > 0
