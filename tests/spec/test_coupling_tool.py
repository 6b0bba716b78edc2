"""tools/coupling_acceptance.py: the head-and-tail race draws from the distribution it races
over (chi-square at 0.001), and the exact rules agree with hand-computed cases."""
import pytest
import torch

from helpers.stats import assert_matches
from helpers.tools import import_tool


@pytest.fixture(scope="module")
def tool():
    return import_tool("coupling_acceptance")


@pytest.mark.parametrize("threshold", [0.0, 0.03, 0.1, 0.5, 2.0])
def test_head_tail_race_draws_from_the_distribution(tool, threshold):
    g = torch.Generator().manual_seed(5)
    r = torch.rand(40, generator=g, dtype=torch.float64) ** 3
    r[7] = 0.0
    r /= r.sum()
    draws = 40000
    e = torch.empty(draws, 40, dtype=torch.float64).exponential_(generator=g)
    u = torch.rand(2, draws, generator=g, dtype=torch.float64)
    winners = tool.head_tail_race(r, e, u[0], u[1], threshold)
    counts = torch.bincount(winners, minlength=40)
    assert counts[7] == 0
    assert_matches(counts, r, f"head-and-tail race, threshold {threshold}", min_df=10)


def test_exact_rules_on_known_distributions(tool):
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    found = tool.rule_acceptance(p, q, gumbel_draws=4000, threshold=0.01)
    assert found["rejection"] == pytest.approx(0.5)
    # inverse CDFs: p's interval of token 1 is [0.5, 1), q's [0, 0.5): they never agree
    assert found["inverse_cdf_coupling"] == pytest.approx(0.0)
    # Gumbel race and the head-and-tail race on a shared key: token 1 wins both iff E1 < E0 and E1 < E2
    for name in ("gumbel_coupling", "head_tail_race"):
        assert abs(found[name] - 1 / 3) < 0.05, (name, found[name])
    same = tool.rule_acceptance(q, q, gumbel_draws=500, threshold=0.01)
    assert all(v == pytest.approx(1.0) for v in same.values())
