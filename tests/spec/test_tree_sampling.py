"""Draft-tree encoding and selection, and the tree sampler's losslessness (chi-square at
significance 0.001 against the exact target law)."""
import numpy as np
import pytest
import torch

from sonarspec_ext import SpecConfig, ops
from sonarspec_ext.spec.tree import DraftTree, TreeBuilder
from helpers.stats import assert_matches

V = 12


def test_tree_encoding_links_depths_and_ancestors():
    #        0
    #     1  2  3
    #    4 5    6
    #    7
    t = DraftTree([9, 1, 2, 3, 4, 5, 6, 7], [-1, 0, 0, 0, 1, 1, 3, 4])
    first, nxt = t.links()
    assert first.tolist() == [1, 4, -1, 6, 7, -1, -1, -1]
    assert nxt.tolist() == [-1, 2, 3, -1, 5, -1, -1, -1]
    assert t.depths.tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    m = t.ancestor_mask()
    assert np.flatnonzero(m[7]).tolist() == [0, 1, 4, 7] and np.flatnonzero(m[6]).tolist() == [0, 3, 6]
    assert t.ancestor_bits()[7] == 0b10010011
    for tokens, parents in (([1, 2], [-1, 1]), ([1, 2], [0, 0]), ([1], [-1, 0])):
        with pytest.raises(ValueError):
            DraftTree(tokens, parents)
    with pytest.raises(ValueError, match="at most 64"):
        DraftTree(list(range(65)), [-1] + [0] * 64)


def test_dynamic_builder_keeps_the_best_connected_nodes():
    """EAGLE-2 selection on hand-made log-probabilities: expansions follow the best
    cumulative scores and the final tree is the top-N of all candidates."""
    b = TreeBuilder(root_token=0, top_k=2, num_nodes=4, depth=3)
    lp = lambda *ps: np.log(np.array(ps))  # noqa: E731
    b.add_children(-1, lp(0.6, 0.3), np.array([10, 11]))
    assert b.to_expand(1) == [0, 1]
    b.add_children(0, lp(0.5, 0.4), np.array([20, 21]))     # scores .30, .24
    b.add_children(1, lp(0.9, 0.05), np.array([22, 23]))    # scores .27, .015
    assert b.to_expand(2) == [2, 4]                         # the two best at depth 2: 20 and 22
    b.add_children(2, lp(0.8, 0.1), np.array([30, 31]))     # .24, .03
    b.add_children(4, lp(0.1, 0.05), np.array([32, 33]))
    assert b.to_expand(3) == []                             # depth limit reached
    tree = b.finish()                                       # best four: 10 .6, 11 .3, 20 .3, 22 .27
    assert tree.tokens == [0, 10, 11, 20, 22] and tree.parents == [-1, 0, 0, 1, 2]


def test_static_paths_fix_the_shape():
    paths = [[0], [1], [0, 0], [0, 2], [0, 0, 0]]
    b = TreeBuilder(root_token=5, top_k=1, num_nodes=len(paths), depth=3, paths=[tuple(p) for p in paths])
    ranked = np.arange(100, 103), np.log(np.array([0.5, 0.3, 0.2]))
    b.add_children(-1, ranked[1], ranked[0])
    assert b.to_expand(1) == [0]                            # only rank 0 has children
    b.add_children(0, ranked[1], ranked[0] + 10)
    assert b.to_expand(2) == [2]
    b.add_children(2, ranked[1], ranked[0] + 20)
    tree = b.finish()
    assert tree.tokens == [5, 100, 101, 110, 112, 120] and tree.parents == [-1, 0, 0, 1, 1, 3]
    with pytest.raises(ValueError, match="every prefix"):
        SpecConfig(method="eagle_tree", tree_paths=[[0], [0, 1, 0]])
    with pytest.raises(ValueError, match="at most 63"):
        SpecConfig(method="eagle_tree", tree_num_nodes=64)


def _random_dist(g, *shape, sharp=2.0):
    return torch.softmax(torch.randn(*shape, V, generator=g, dtype=torch.float64) * sharp, -1)


# root -> children a, b, c; a -> children d, e  (node indices 0..5)
_PARENTS = [-1, 0, 0, 0, 1, 1]


def _links(n_rows):
    first, nxt = DraftTree([0] * 6, _PARENTS).links()
    rep = lambda a: torch.from_numpy(a).repeat(n_rows, 1)  # noqa: E731
    return rep(first), rep(nxt)


def _check_two_token_law(out, num_accepted, p_root, p_after):
    """First emitted token ~ p_root; the second, when the first was accepted from the tree,
    ~ p_after[first] (conditioned on how often each first token was accepted)."""
    first = out[:, 0]
    assert_matches(torch.bincount(first, minlength=V), p_root, "first token", min_df=5)
    two = num_accepted >= 1
    pairs = torch.bincount(out[two, 0] * V + out[two, 1], minlength=V * V)
    n_first = torch.bincount(out[two, 0], minlength=V).double()
    expected = (n_first[:, None] * p_after).flatten()
    assert_matches(pairs, expected / expected.sum(), "second token", min_df=5)


@pytest.mark.parametrize("seed", [0, 1])
def test_point_mass_children_are_lossless(seed):
    """Distinct deterministic children (top-k drafting): the first two emitted tokens follow
    the target law, whatever the tree guessed."""
    g = torch.Generator().manual_seed(seed)
    p_root, p_after = _random_dist(g, 1)[0], _random_dist(g, V)
    tokens = [0, 3, 7, 1, 5, 2]                      # a=3, b=7, c=1; d=5, e=2 under a
    n = 6000
    probs = torch.stack([p_root, p_after[3], p_after[7], p_after[1], p_after[5], p_after[2]])
    first, nxt = _links(n)
    out, index, num_accepted = ops.tree_speculative_sampling(
        torch.tensor(tokens).repeat(n, 1), first, nxt, probs.float().expand(n, -1, -1).contiguous(), generator=g)
    _check_two_token_law(out, num_accepted, p_root, p_after)
    assert (index[:, 0] == 0).all() and int(num_accepted.max()) == 2
    assert int(num_accepted.sum()) > 0.3 * n         # the tree is used, not always rejected


def test_sampled_children_are_lossless():
    """Children drawn independently from the draft q (with replacement) and verified with
    the residual rule: the same target law."""
    g = torch.Generator().manual_seed(7)
    p_root, p_after = _random_dist(g, 1)[0], _random_dist(g, V)
    q_root, q_after = _random_dist(g, 1, sharp=1.0)[0], _random_dist(g, V, sharp=1.0)
    n = 6000
    c = torch.multinomial(q_root, 3 * n, replacement=True, generator=g).view(n, 3)        # children of the root
    gc = torch.stack([torch.multinomial(q_after[x], 2, replacement=True, generator=g) for x in c[:, 0]])
    cand = torch.cat([torch.zeros(n, 1, dtype=torch.long), c, gc], 1)
    target = torch.stack([p_root.expand(n, -1)] + [p_after[cand[:, j]] for j in range(1, 6)], 1)
    draft = torch.stack([q_root.expand(n, -1)] + [q_after[cand[:, j]] for j in range(1, 6)], 1)
    first, nxt = _links(n)
    out, _, num_accepted = ops.tree_speculative_sampling(cand, first, nxt, target.float(), draft.float(), generator=g)
    _check_two_token_law(out, num_accepted, p_root, p_after)


def test_one_hot_target_follows_its_path_and_bad_inputs_are_refused():
    tokens = torch.tensor([[0, 3, 7, 1, 5, 2]])
    probs = torch.zeros(1, 6, V)
    probs[0, 0, 1], probs[0, 3, 4] = 1, 1            # root -> c (token 1) -> 4 (not drafted)
    first, nxt = _links(1)
    out, index, num_accepted = ops.tree_speculative_sampling(tokens, first, nxt, probs)
    assert out[0, :2].tolist() == [1, 4] and index[0, :2].tolist() == [0, 3] and int(num_accepted[0]) == 1
    with pytest.raises(ValueError, match="candidates must lie"):
        ops.tree_speculative_sampling(tokens + V, first, nxt, probs)
    with pytest.raises(ValueError, match="later node"):
        ops.tree_speculative_sampling(tokens, first * 0, nxt, probs)
    with pytest.raises(ValueError, match="draft_probs has shape"):
        ops.tree_speculative_sampling(tokens, first, nxt, probs, probs[:, :3])


@pytest.mark.parametrize("B,V,sampled", [(1, 111, False), (7, 8192, True), (40, 32000, False), (9, 500, True)])
def test_native_tree_sampler_equals_the_reference_draw_for_draw(B, V, sampled):
    """Random trees (up to 12 nodes), same uniforms: same tokens, paths and counts as the
    torch reference, with point-mass and sampled children."""
    from sonarspec_ext.testing.reference import tree_speculative_sampling_reference
    g = torch.Generator().manual_seed(B + V)
    N = 12
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, N)]
    first, nxt = (torch.from_numpy(a).repeat(B, 1) for a in DraftTree([0] * N, parents).links())
    logits = torch.randn(B, N, V, generator=g) * 3
    logits[:, :, :3] += 14                             # mass on a few tokens, so paths get accepted
    p = logits.softmax(-1)
    cand = torch.randint(0, 3, (B, N), generator=g)
    q = (torch.randn(B, N, V, generator=g) * 3).softmax(-1) if sampled else None
    u = torch.rand(B, N + 1, dtype=torch.float64, generator=g)
    got = ops.tree_speculative_sampling(cand, first, nxt, p, q, uniforms=u)
    want = tree_speculative_sampling_reference(cand, first, nxt, p, q, u)
    for a, b, name in zip(got, want, ("tokens", "accept_index", "num_accepted")):
        assert torch.equal(a, b), name
    if B > 5:
        assert (got[2] > 0).any()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tree_sampler_equals_cpu():
    g = torch.Generator().manual_seed(0)
    B, N, V = 33, 10, 32000
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, N)]
    first, nxt = (torch.from_numpy(a).repeat(B, 1) for a in DraftTree([0] * N, parents).links())
    p = (torch.randn(B, N, V, generator=g) * 4).softmax(-1)
    cand = torch.randint(0, V, (B, N), generator=g)
    u = torch.rand(B, N + 1, dtype=torch.float64, generator=g)
    for q in (None, (torch.randn(B, N, V, generator=g) * 3).softmax(-1)):
        cpu = ops.tree_speculative_sampling(cand, first, nxt, p, q, uniforms=u)
        cuda = ops.tree_speculative_sampling(cand.cuda(), first.cuda(), nxt.cuda(), p.cuda(),
                                             None if q is None else q.cuda(), uniforms=u.cuda())
        assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, cuda))
