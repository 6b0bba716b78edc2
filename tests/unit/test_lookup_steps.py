"""Lookup steps measured apart by the adaptive speculation control (engine/lookup_steps.py):
a draft length's rate is its chain steps' tokens and seconds blended with the lookup
steps' at their share, and lookup drafts - as long as the repetition, whatever the mode -
never enter the acceptance per draft position."""
import pytest

from sonarspec_ext.engine.lookup_steps import LookupSteps
from sonarspec_ext.engine.spec_control import BatchSpeculationControl, SpeculationControl


def test_the_blend_is_exact_for_a_steady_share():
    steps = LookupSteps(window=10 ** 9, min_samples=2)
    assert steps.rate(2.0, 0.01) == 200.0   # nothing measured: the chain steps' own rate
    for i in range(400):
        steps.count(i % 4 == 0)
        if i % 4 == 0:
            steps.record(9.0, 0.03)
    assert steps.share == pytest.approx(0.25)
    assert steps.rate(2.0, 0.012) == pytest.approx((0.75 * 2 + 0.25 * 9) / (0.75 * 0.012 + 0.25 * 0.03))


def test_bad_settings_are_refused():
    for bad in ({"window": 0}, {"min_samples": 0}):
        with pytest.raises(ValueError, match="LookupSteps"):
            LookupSteps(**bad)


class LookupWorld:
    """Plain decoding: 1 token in 10 ms. Every 4th drafting step drafts from the context:
    9 tokens in 30 ms whatever the mode; the other drafting steps keep their first draft
    and never a second: 2 tokens, K = 1 in 12 ms, K = 2 in 20 ms. So K = 1 runs at (0.75 * 2
    + 0.25 * 9) / (0.75 * 12 + 0.25 * 30) ms = 227 tokens/s and K = 2 at 167: the lookup
    steps lift both alike."""

    def __init__(self):
        self.drafting = 0

    def step(self, k):
        """(seconds, tokens, lookup) of a step drafting up to ``k`` tokens."""
        if k == 0:
            return 0.010, 1, False
        self.drafting += 1
        if self.drafting % 4 == 0:
            return 0.030, 9, True
        return (0.012, 0.020)[k - 1], 2, False


def run(control, steps=600):
    world = LookupWorld()
    for _ in range(steps):
        mode = control.mode
        seconds, tokens, lookup = world.step(mode)
        control.record(seconds, tokens, measured=True, accepted=[tokens - 1] if mode else None, lookup=[lookup])
    return control


def test_lookup_steps_count_at_their_share_and_stay_out_of_the_acceptance():
    c = run(SpeculationControl(modes=(2, 1, 0)))
    assert c.winner == 1
    assert c.rates[1] == pytest.approx(3.75 / 0.0165, rel=0.05)
    # the modes' own measurements are their chain steps alone (rate 2 from the pooled positions,
    # the second shrunk towards a geometric continuation while few steps have drafted it)
    assert c.per_sequence[1] == pytest.approx((2.0, 0.012)) and c.per_sequence[2] == pytest.approx((2.0, 0.020))
    assert c.rates[2] < c.rates[1]
    assert c.rates[0] == pytest.approx(100.0)
    # the 8 drafts a lookup step keeps are not the chain's: position 2 never kept
    assert c.acceptance.samples[1] > 0 and c.acceptance.kept[1] == 0 and c.acceptance.kept[0] > 0
    assert c.lookup_steps.share == pytest.approx(0.25, abs=0.02)


def test_without_pooling_the_rates_are_the_steps_as_measured():
    """The simpler rule: each mode's tokens over its seconds as its own steps measured them,
    lookup steps included (a probe's rate then depends on how many of its steps looked up)."""
    c = run(SpeculationControl(modes=(2, 1, 0), pool_acceptance=False))
    assert c.lookup_steps.samples == 0 and c.acceptance.kept[1] > 0
    assert c.rates[0] == pytest.approx(100.0) and c.per_sequence[2][0] > 2.0


def test_only_a_batch_of_one_measures_lookup_steps_apart():
    """In a larger batch nearly every step has a sequence drafting from the context: its
    classes take each mode's steps as measured; without lookup drafts every class pools."""
    c = BatchSpeculationControl(lookup_drafts=True, modes=(2, 1, 0))
    assert c.for_batch(1).pool_acceptance and not c.for_batch(2).pool_acceptance
    assert not c.for_batch(40).pool_acceptance
    plain = BatchSpeculationControl(modes=(2, 1, 0))
    assert all(plain.for_batch(n).pool_acceptance for n in (1, 2, 40))
