"""ops.chain_speculative_sampling: exact one-hot cases and the distribution it emits."""
import pytest
import torch

from sonarspec_ext import ops
from sonarspec_ext.sampling.uniforms import GeneratorUniforms, KeyedUniforms
from helpers.stats import assert_matches


def onehot(ids, V):
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float()


def test_one_hot_cases():
    V = 5
    # draft agrees with a one-hot target everywhere: all accepted, bonus from the last row
    q = onehot([[1, 2]], V)
    p = onehot([[1, 2, 4]], V)
    out, acc, em = ops.chain_speculative_sampling(q, torch.tensor([[1, 2]]), p)
    assert out.tolist() == [[1, 2, 4]] and acc.tolist() == [2] and em.tolist() == [2]
    # first draft rejected (target puts no mass on it): residual is the target's token
    p = onehot([[3, 2, 4]], V)
    out, acc, em = ops.chain_speculative_sampling(q, torch.tensor([[1, 2]]), p)
    assert out.tolist() == [[3, -1, -1]] and em.tolist() == [0] and acc.tolist() == [1]
    # second rejected
    p = onehot([[1, 0, 4]], V)
    out, acc, em = ops.chain_speculative_sampling(q, torch.tensor([[1, 2]]), p)
    assert out.tolist() == [[1, 0, -1]] and em.tolist() == [1]


def test_greedy_verify():
    assert ops.greedy_verify(torch.tensor([4, 5, 6]), torch.tensor([4, 5, 7, 9])) == ([4, 5, 7], 2)
    assert ops.greedy_verify(torch.tensor([4, 5]), torch.tensor([4, 5, 8])) == ([4, 5, 8], 2)
    assert ops.greedy_verify(torch.tensor([], dtype=torch.long), torch.tensor([3])) == ([3], 0)


def test_rejects_bad_shapes():
    q = torch.rand(2, 3, 7)
    with pytest.raises(ValueError, match="draft_probs has shape"):
        ops.chain_speculative_sampling(q, torch.zeros(2, 2, dtype=torch.long), torch.rand(2, 3, 7))
    with pytest.raises(ValueError, match="draft_token_ids has shape"):
        ops.chain_speculative_sampling(q, torch.zeros(2, 2, dtype=torch.long), torch.rand(2, 4, 7))
    with pytest.raises(ValueError, match=r"draft_token_ids has shape .*\(target_probs has 3 positions\)"):
        ops.chain_speculative_sampling(q, torch.zeros(2, 3, dtype=torch.long), torch.rand(2, 3, 7))
    with pytest.raises(ValueError, match="draft_token_ids must lie"):
        ops.chain_speculative_sampling(q, torch.full((2, 3), 7), torch.rand(2, 4, 7))
    with pytest.raises(ValueError, match="draft_probs has dtype"):
        ops.chain_speculative_sampling(q.half(), torch.zeros(2, 3, dtype=torch.long), torch.rand(2, 4, 7))


@pytest.mark.parametrize("point_mass_draft", [False, True])
def test_emitted_tokens_follow_the_target(point_mass_draft):
    """Rows share one p and q per position; drafts are drawn from q (or are q's argmax).
    Checks: first emitted token ~ p_0; second (when the first was accepted) ~ p_1;
    emitted-length law P(L=0)=1-b1, P(L=1)=b1(1-b2), P(L=2)=b1*b2 (b_j = sum min(p_j, q_j))."""
    V, K, N = 6, 2, 12000
    g = torch.Generator().manual_seed(7)
    p = torch.rand(K + 1, V, generator=g).pow(2)
    p /= p.sum(-1, keepdim=True)
    q = torch.rand(K, V, generator=g)
    q /= q.sum(-1, keepdim=True)
    if point_mass_draft:
        ids = q.argmax(-1).expand(N, K).contiguous()
        q = torch.nn.functional.one_hot(q.argmax(-1), V).float()
    else:
        ids = torch.stack([torch.multinomial(q[j], N, replacement=True, generator=g) for j in range(K)], 1)
    out, acc, em = ops.chain_speculative_sampling(q.expand(N, K, V).contiguous(), ids,
                                                  p.expand(N, K + 1, V).contiguous(), generator=g)
    assert_matches(torch.bincount(out[:, 0].long(), minlength=V), p[0], "first token", min_df=4)
    second = out[em >= 1, 1].long()
    assert_matches(torch.bincount(second, minlength=V), p[1], "second token", min_df=4)
    b = torch.minimum(p[:K], q).sum(-1).double()
    law = torch.stack([1 - b[0], b[0] * (1 - b[1]), b[0] * b[1]])
    assert_matches(torch.bincount(em.long(), minlength=3), law, "emitted length", min_df=2)
    assert ((out >= 0).sum(1) == em + 1).all()


@pytest.mark.parametrize("k,sampled_q", [(1, False), (3, True), (7, False), (4, True)])
def test_device_verification_equals_the_reference_draw_for_draw(k, sampled_q):
    """spec.verify.verify_chain_device (vectorised, no host sync) draws the same uniforms
    from the generator as the op and returns the reference's tokens."""
    from sonarspec_ext.testing.reference import chain_speculative_sampling_reference
    from sonarspec_ext.params import SamplingParams
    from sonarspec_ext.spec.verify import verify_chain_device
    params = SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(k)
    for trial in range(200):
        V = 5 + trial % 7
        logits = torch.randn(k + 1, V, generator=g) * 2
        p = logits.softmax(-1)
        q = torch.randn(k, V, generator=g).softmax(-1) if sampled_q else None
        ids = torch.randint(0, V, (k,), generator=g)
        if trial % 3 == 0:   # drafts the target likes: long accepted prefixes
            ids = p[:k].argmax(-1)
        qq = q if sampled_q else torch.nn.functional.one_hot(ids, V).float()
        u = torch.rand(1, k + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(trial))
        out, _, emitted = chain_speculative_sampling_reference(qq[None], ids[None], p[None], u)
        tokens, a = verify_chain_device(logits, ids, q, params, GeneratorUniforms(torch.Generator().manual_seed(trial)))
        assert int(a) == int(emitted[0])
        assert tokens[:int(a) + 1].tolist() == out[0, :int(a) + 1].tolist()


def _random_case(B, K, V, seed, point_mass):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=g) * 3
    liked = torch.arange(B) % 2 == 0                  # half the rows draft tokens the target favours
    logits[liked, :K, :2] += 16
    p = logits.softmax(-1)
    q = None if point_mass else (torch.randn(B, K, V, generator=g) * 3).softmax(-1)
    ids = torch.randint(0, V, (B, K), generator=g)
    ids[liked] = torch.randint(0, 2, (int(liked.sum()), K), generator=g)
    u = torch.rand(B, K + 1, dtype=torch.float64, generator=g)
    return q, ids, p, u


@pytest.mark.parametrize("B,K,V", [(1, 1, 111), (7, 3, 8192), (99, 7, 111), (7, 1, 32000), (64, 4, 32000)])
@pytest.mark.parametrize("point_mass", [False, True])
def test_native_equals_the_reference_draw_for_draw(B, K, V, point_mass):
    """Same uniforms -> same tokens and counts as the torch reference (which builds one-hot
    rows for point-mass drafts; the native kernel needs none)."""
    from sonarspec_ext.testing.reference import chain_speculative_sampling_reference
    q, ids, p, u = _random_case(B, K, V, seed=B * 1000 + K * 10 + V % 7, point_mass=point_mass)
    got = ops.chain_speculative_sampling(q, ids, p, uniforms=u)
    want = chain_speculative_sampling_reference(q, ids, p, u)
    for g, w, name in zip(got, want, ("tokens", "accepted_num", "emitted_num")):
        assert torch.equal(g, w), name
    if B > 1:   # both accepted prefixes and rejections occur
        assert (got[2] > 0).any() and (got[2] < K).any()


def test_point_mass_drafts_equal_one_hot_rows_and_generator_is_reproducible():
    q, ids, p, u = _random_case(16, 4, 500, seed=3, point_mass=True)
    one_hot = torch.nn.functional.one_hot(ids, 500).float()
    a = ops.chain_speculative_sampling(None, ids, p, uniforms=u)
    b = ops.chain_speculative_sampling(one_hot, ids, p, uniforms=u)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    r1 = ops.chain_speculative_sampling(None, ids, p, generator=torch.Generator().manual_seed(5))
    r2 = ops.chain_speculative_sampling(None, ids, p, generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(x, y) for x, y in zip(r1, r2))


def test_native_rejects_bad_tensors_before_any_native_call():
    q, ids, p, u = _random_case(2, 3, 7, seed=0, point_mass=False)
    with pytest.raises(ValueError, match="uniforms has dtype"):
        ops.chain_speculative_sampling(q, ids, p, uniforms=u.float())
    with pytest.raises(ValueError, match="uniforms has shape"):
        ops.chain_speculative_sampling(q, ids, p, uniforms=u[:, :3].contiguous())
    with pytest.raises(ValueError, match="target_probs must be contiguous"):
        ops.chain_speculative_sampling(q, ids, p.transpose(0, 1).contiguous().transpose(0, 1), uniforms=u)
    with pytest.raises(ValueError, match="draft_token_ids has dtype"):
        ops.chain_speculative_sampling(q, ids.short(), p, uniforms=u)
    # FlashInfer's int32 ids give the same results as int64
    assert all(torch.equal(a, b) for a, b in zip(ops.chain_speculative_sampling(q, ids.int(), p, uniforms=u),
                                                  ops.chain_speculative_sampling(q, ids, p, uniforms=u)))
    with pytest.raises(ValueError, match="target_probs has dtype"):
        ops.chain_speculative_sampling(q, ids, p.double(), uniforms=u)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("B,K,V", [(1, 1, 111), (7, 3, 8192), (99, 7, 32000)])
def test_cuda_equals_cpu(B, K, V):
    q, ids, p, u = _random_case(B, K, V, seed=11, point_mass=False)
    cpu = ops.chain_speculative_sampling(q, ids, p, uniforms=u)
    cuda = ops.chain_speculative_sampling(q.cuda(), ids.cuda(), p.cuda(), uniforms=u.cuda())
    for c, g in zip(cpu, cuda):
        assert torch.equal(c, g.cpu())
    cpu = ops.chain_speculative_sampling(None, ids, p, uniforms=u)
    cuda = ops.chain_speculative_sampling(None, ids.cuda(), p.cuda(), uniforms=u.cuda())
    assert all(torch.equal(c, g.cpu()) for c, g in zip(cpu, cuda))


def test_batched_engine_verification_equals_per_request_verification():
    """spec.verify.verify_chains (native, grouped by chain length; coupled chains of seeded
    requests in their own call) returns what verify_chain returns request by request, with
    the same per-request uniforms."""
    from sonarspec_ext.params import SamplingParams
    from sonarspec_ext.spec.proposer import Draft
    from sonarspec_ext.spec.verify import verify_chain, verify_chains
    g = torch.Generator().manual_seed(0)
    items = []
    for i in range(40):
        k, V = 1 + i % 4, 300
        logits = torch.randn(k + 1, V, generator=g) * 3
        ids = logits[:k].argmax(-1) if i % 3 else torch.randint(0, V, (k,), generator=g)
        probs = (torch.randn(k, V, generator=g) * 3).softmax(-1) if i % 2 else None
        params = SamplingParams(temperature=[0.0, 0.7, 1.0, 1.3][i % 4], top_k=[0, 20][i % 2], seed=i)
        items.append((logits, Draft(ids.tolist(), probs), params, i))
    gens = lambda: [GeneratorUniforms(torch.Generator().manual_seed(seed)) if seed % 5 else  # noqa: E731
                    KeyedUniforms(seed, 3 * seed) for *_, seed in items]
    batched = verify_chains([(lg, d, p, gen) for (lg, d, p, _), gen in zip(items, gens())])
    single = [verify_chain(lg, d, p, gen) for (lg, d, p, _), gen in zip(items, gens())]
    assert batched == single
    assert {a for _, a in single} >= {0, 1, 2}


def test_chains_whose_logits_lie_back_to_back_are_verified_from_one_view():
    """A step's blocks of logits (views into one tensor) verify exactly as copies of them do;
    spec.verify.joined_rows joins back-to-back views without a copy, and copies any other order."""
    from sonarspec_ext.params import SamplingParams
    from sonarspec_ext.spec.proposer import Draft
    from sonarspec_ext.spec.verify import joined_rows, verify_chains
    g = torch.Generator().manual_seed(1)
    ks = [0, 2, 1, 3, 0, 2]
    step = torch.randn(sum(k + 1 for k in ks), 500, generator=g) * 3
    views, at = [], 0
    for k in ks:
        views.append(step[at:at + k + 1])
        at += k + 1
    joined = joined_rows(views)
    assert joined.data_ptr() == step.data_ptr() and torch.equal(joined, step)
    shuffled = [views[2], views[0], views[1]]
    assert torch.equal(joined_rows(shuffled), torch.cat(shuffled)) and joined_rows(shuffled).data_ptr() != step.data_ptr()
    gapped = [views[0], views[2]]
    assert torch.equal(joined_rows(gapped), torch.cat(gapped))
    for temperature in (0.0, 0.8):
        def run(blocks):
            out = []
            for i, (lg, k) in enumerate(zip(blocks, ks)):
                ids = torch.randint(0, 500, (k,), generator=torch.Generator().manual_seed(i)).tolist()
                params = SamplingParams(temperature=temperature, seed=i)
                out.append((lg, Draft(ids), params, GeneratorUniforms(torch.Generator().manual_seed(i))))
            return verify_chains(out)
        assert run(views) == run([v.clone() for v in views])
