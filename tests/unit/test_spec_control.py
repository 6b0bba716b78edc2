"""Adaptive speculation (engine/spec_control.py): a simulated machine where one mode is
faster must end up running mostly that mode, probing the other; in the engine the choice
never changes tokens."""
import random

import pytest

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.engine.draft_acceptance import geometric_acceptance
from sonarspec_ext.engine.spec_control import BatchSpeculationControl, SpeculationControl


def simulate(spec_tok_s: float, plain_tok_s: float, steps: int = 3000) -> SpeculationControl:
    c = SpeculationControl()
    for _ in range(steps):
        rate = spec_tok_s if c.speculate else plain_tok_s
        tokens = 2 if c.speculate else 1
        c.record(tokens / rate, tokens, measured=True)
    return c


def world(fixed: float, per_row: float, per_draft: float, acceptance: float, batch: int = 1):
    """A simulated machine: a step over ``batch`` sequences drafting K tokens each takes
    fixed + per_row * batch * (1 + K) + per_draft * batch * K seconds and gives each
    sequence 1 + a + ... + a^K tokens (geometric acceptance a)."""
    def step(k: int):
        return (fixed + per_row * batch * (1 + k) + per_draft * batch * k,
                batch * sum(acceptance ** i for i in range(k + 1)))
    return step


def run(c: SpeculationControl, step, steps: int, batch: int = 1) -> None:
    for _ in range(steps):
        seconds, tokens = step(c.mode)
        c.record(seconds, tokens, measured=True, sequences=batch)


def test_the_fastest_draft_length_wins():
    """One stream, memory-bound: 10 ms a step plus 3 ms a draft token, acceptance 0.7 -
    K = 3 / 2 / 1 / 0 at 133 / 137 / 131 / 100 tok/s. K = 2 runs most steps; its
    neighbours 3 and 1 (predicted within the margin) and plain decoding are still probed."""
    c = SpeculationControl(modes=(3, 2, 1, 0))
    run(c, world(0.010, 0.0, 0.003, 0.7), 4000)
    assert c.winner == 2 and c.steps[2] > 0.85 * sum(c.steps.values())
    assert all(c.steps[m] > 0 for m in c.modes)
    assert c.rates[2] == pytest.approx(2.19 / 0.016)
    acceptance, slope = c.model()
    assert acceptance == pytest.approx(0.7) and slope == pytest.approx(0.003)


def test_a_new_controller_measures_its_start_and_plain_decoding_then_prices_the_rest():
    """64 streams on a CPU, where a verification row costs as much as a decoding one: a short
    run pays for one probe of the start length and measures plain decoding; the cost model
    (fitted to those two) prices K = 1 far below plain decoding and skips its probe - and
    keeps skipping the winner's probes until its phases reach their longest."""
    step = world(0.005, 0.001, 0.0003, 0.7, batch=64)
    c = SpeculationControl(modes=(2, 1, 0))
    run(c, step, 900, batch=64)
    assert c.winner == 0 and c.steps[2] == c.probe_steps and c.steps[1] == 0 and c.skipped >= 4
    seconds, tokens = step(1)
    assert c.predicted_rate(1) == pytest.approx(tokens / seconds)   # the model is exact in its own world
    run(c, step, 2000, batch=64)   # past the longest phase, K = 1 is measured after all
    assert c.steps[1] > 0 and c.winner == 0


def test_a_prior_acceptance_outweighs_an_unlucky_opening():
    """One stream where drafts pay (10 ms a step plus 3 ms a draft token; each draft kept
    with probability 0.65 given the ones before, drawn with a fixed seed: K = 3 about 1.26x
    plain) but the reply's first 12 steps keep no draft (a reply's opening). Without a
    prior the survey's probe of K = 3 measures 1 token a step, plain decoding wins, and the
    phases that follow run plainly: the reply's next 150 steps decode plainly. With the
    drafter's validated acceptance as the prior, the probe is priced at the prior blended
    with its bad steps and most of the 150 steps speculate. A drafter that really keeps
    nothing is still turned off, the prior fading with its samples."""
    def opening(c, unlucky_steps=12, steps=162, acceptance=0.65):
        rng = random.Random(0)
        for i in range(steps):
            kept = 0
            while i >= unlucky_steps and kept < c.mode and rng.random() < acceptance:
                kept += 1
            c.record(0.010 + 0.003 * c.mode, 1 + kept, measured=True, accepted=[kept])
        return c
    prior = [0.65, 0.42, 0.27]
    blind = opening(SpeculationControl(modes=(3, 2, 1, 0)))
    informed = opening(SpeculationControl(modes=(3, 2, 1, 0), prior_acceptance=prior))
    assert blind.steps[0] > 150
    assert sum(n for m, n in informed.steps.items() if m) > 120
    hopeless = opening(SpeculationControl(modes=(3, 2, 1, 0), prior_acceptance=prior), steps=400, acceptance=0.0)
    assert hopeless.winner == 0 and hopeless.steps[0] > 300


def test_the_survey_probes_what_the_model_cannot_rule_out():
    """Drafts that are nearly free (a memory-bound GPU step): every length is predicted to
    win, so the climb measures them, and the longest wins."""
    c = SpeculationControl(modes=(1, 2, 3, 0))
    run(c, world(0.010, 0.00001, 0.0001, 0.8, batch=8), 3000, batch=8)
    assert c.winner == 3 and all(c.steps[m] > 0 for m in c.modes)


def test_the_acceptance_fit():
    for a in (0.0, 0.3, 0.7, 0.95):
        for k in (1, 2, 5):
            assert geometric_acceptance(sum(a ** i for i in range(k + 1)), k) == pytest.approx(a, abs=1e-6)
    assert geometric_acceptance(0.5, 3) == 0.0 and geometric_acceptance(9.0, 3) == pytest.approx(0.999)


@pytest.mark.parametrize("spec,plain", [(150.0, 100.0), (80.0, 100.0), (60.0, 200.0)])
def test_the_faster_mode_runs_most_steps(spec, plain):
    c = simulate(spec, plain)
    faster = spec > plain
    winner = 1 if faster else 0
    share = c.steps[winner] / (c.steps[1] + c.steps[0])
    assert share > 0.9, c.steps
    assert c.steps[1 - winner] > 0   # the other mode is still probed
    assert c.rates[1] == pytest.approx(spec) and c.rates[0] == pytest.approx(plain)


def test_the_engine_starts_from_the_drafters_validated_acceptance(tmp_path):
    """An adaptive engine's controller starts from the acceptance per position its drafter's
    training.json records from a validation run of the same method (the packaged head);
    methods that draft otherwise (trees, n-grams) and drafters without one start blind."""
    import json
    from sonarspec_ext import assets
    from sonarspec_ext.spec.factory import validated_acceptance
    with open(f"{assets.path('mtp')}/training.json") as fh:
        recorded = json.load(fh)["engine_validation"]["accepted_per_position"]
    llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=3), adaptive_speculation=True)
    control = llm.engine.spec_control.for_batch(1)
    assert control.acceptance.tokens_per_step(3) == pytest.approx(1 + sum(recorded[:3]))
    assert validated_acceptance(assets.path("mtp"), "mtp") == recorded
    assert validated_acceptance(assets.path("mtp"), "eagle_tree") is None
    assert validated_acceptance(assets.path("draft"), "draft_target") is None   # records no validation run
    (tmp_path / "training.json").write_text(json.dumps({"engine_validation": {
        "method": "draft_target", "accepted_per_position": [0.5, 0.3]}}))
    assert validated_acceptance(str(tmp_path), "draft_target") == [0.5, 0.3]
    assert validated_acceptance(str(tmp_path), "mtp") is None
    (tmp_path / "training.json").write_text("{not json")
    assert validated_acceptance(str(tmp_path), "draft_target") is None


def test_a_change_of_regime_is_followed():
    c = simulate(80.0, 100.0)
    assert c.winner == 0
    for _ in range(3000):   # speculation becomes the faster mode (say, traffic changed)
        tokens = 2 if c.speculate else 1
        c.record(tokens / (200.0 if c.speculate else 100.0), tokens, measured=True)
    assert c.winner == 1


def test_unmeasured_steps_do_not_move_the_estimates():
    c = SpeculationControl(phase_steps=2, probe_steps=1)
    for _ in range(50):
        c.record(1.0, 1, measured=False)
    assert c.rates == {1: None, 0: None} and c.speculate


def test_bad_settings_raise():
    with pytest.raises(ValueError):
        SpeculationControl(phase_steps=0)


def test_adaptive_engine_gives_plain_tokens():
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    prompts = ["def add(a, b):\n    return", "The quick brown fox"]
    ref = [o.token_ids for o in LLM("default").generate(prompts, params)]
    llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=2), adaptive_speculation=True)
    for _ in range(3):
        assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    s = llm.stats()["adaptive_speculation"]
    # Which mode wins depends on this machine's timings; the survey does not: both prompts
    # decode together (class 2+), K = 2 is measured first (probe_steps = 4 measured steps),
    # then plain decoding as the baseline.
    two = s["classes"]["2+"]
    assert two[2] > 0 and two[0] > 0
    assert s["speculating_steps"] >= 4 and s["plain_steps"] >= 4
    steps = s["class_steps"].values()   # over the classes, the totals
    assert sum(n for c in steps for k, n in c.items() if k) == s["speculating_steps"]
    assert sum(c[0] for c in steps) == s["plain_steps"]


def test_batch_size_classes_learn_separately():
    c = BatchSpeculationControl()
    assert c.for_batch(1) is not c.for_batch(2) and c.for_batch(2) is c.for_batch(3)
    assert c.for_batch(32) is c.for_batch(500) and c.for_batch(0) is c.for_batch(1)
    for _ in range(3000):   # one stream: speculation is faster; 40 streams: plain is
        for n, (spec, plain) in ((1, (150.0, 100.0)), (40, (300.0, 600.0))):
            k = c.for_batch(n)
            tokens = 2 if k.speculate else 1
            k.record(tokens / (spec if k.speculate else plain), tokens, measured=True)
    assert c.for_batch(1).winner == 1 and c.for_batch(40).winner == 0
    assert c.for_batch(20).winner == 0   # a new class starts from its nearest neighbour's verdict


def test_plain_decoding_is_measured_even_past_a_slower_k1():
    """A drafter with a fixed cost per step: K = 1 slower than both plain decoding and K = 2,
    K = 2 slower than plain. The survey from K = 2 measures plain decoding (not only K = 1
    and 3), and plain decoding wins."""
    rates = {3: 80.0, 2: 95.0, 1: 90.0, 0: 100.0}
    c = SpeculationControl(modes=(3, 2, 1, 0))
    c.start_with(2)
    for _ in range(2000):
        c.record(1 / rates[c.mode], 1, measured=True)
    assert c.winner == 0 and c.steps[0] > 0.85 * sum(c.steps.values())


def test_a_new_class_climbs_from_its_neighbours_verdict():
    """A batch class first seen after its neighbour settled on plain decoding measures
    plain decoding and K = 1, and never runs the longer drafts (which lose more)."""
    rates = {4: 200.0, 3: 250.0, 2: 300.0, 1: 450.0, 0: 600.0}
    c = BatchSpeculationControl(modes=(4, 3, 2, 1, 0))
    big = c.for_batch(40)
    for _ in range(200):
        big.record(1 / rates[big.mode], 1, measured=True)
    assert big.winner == 0
    new = c.for_batch(20)
    for _ in range(60):
        new.record(1 / rates[new.mode], 1, measured=True)
    assert new.winner == 0 and new.steps[1] > 0 and new.steps[2] == new.steps[3] == new.steps[4] == 0


def test_a_larger_class_borrows_the_cost_model_and_starts_plain():
    """Speculation wins for one stream and loses badly for 40 (each sequence's drafts cost
    as much there as at batch 1, its plain step far less): the 40-stream class starts from
    plain decoding with the 1-stream class's model and never speculates; where drafts stay
    cheap at 40 streams, the borrowed model lets it probe them, and they win there too."""
    for per_draft, spec_wins in ((0.003, False), (0.00002, True)):
        c = BatchSpeculationControl(modes=(2, 1, 0))
        one = c.for_batch(1)
        run(one, world(0.010, 0.0, per_draft if spec_wins else 0.001, 0.7), 500)
        assert one.winner > 0
        big = c.for_batch(40)
        assert big.mode == 0 and big.prior == one.model()
        run(big, world(0.010, 0.0002, per_draft, 0.7, batch=40), 300, batch=40)
        assert (big.winner > 0) == spec_wins
        assert (big.steps[1] + big.steps[2] == 0) == (not spec_wins)


def test_the_first_large_batch_surveys_from_plain_decoding():
    """With nothing measured yet, a class of 4 or more sequences starts from plain decoding
    (then climbs through K = 1), a smaller one from the configured length - also after
    steps that only prefilled (no decoding sequence: the 1-sequence class, measuring
    nothing), whose start is no verdict to copy."""
    c = BatchSpeculationControl(modes=(4, 3, 2, 1, 0))
    assert c.for_batch(0).mode == 4          # prefill-only steps: nothing measured
    big = c.for_batch(64)
    assert big.mode == 0 and big.prior is None
    rates = {4: 100.0, 3: 150.0, 2: 250.0, 1: 450.0, 0: 600.0}
    for _ in range(100):
        big.record(1 / rates[big.mode], 1, measured=True)
    assert big.winner == 0 and big.steps[4] == big.steps[3] == big.steps[2] == 0 and big.steps[1] > 0
    assert BatchSpeculationControl(modes=(4, 3, 2, 1, 0)).for_batch(2).mode == 4
    assert BatchSpeculationControl(modes=(4, 3, 2, 1, 0)).for_batch(4).mode == 0


def test_a_batch_moving_across_a_class_boundary_keeps_its_class():
    """16 clients: the decoding batch moves 15, 16, 15, ... as requests finish and arrive;
    it stays in the class it entered (no verdict flapping), and leaves it once it moves a
    quarter of the class's lower bound beyond its range."""
    c = BatchSpeculationControl()
    first = c.for_batch(15)
    assert all(c.for_batch(n) is first for n in (16, 15, 17, 14, 16, 6))
    assert c.for_batch(18) is not first and c.for_batch(18) is c.for_batch(12)   # the 16-31 class
    assert c.for_batch(11) is first and c.for_batch(5) is not first
    assert c.for_batch(1) is not c.for_batch(2)   # the smallest classes take no slack


def test_a_priced_out_neighbour_does_not_delay_the_probe_of_one_that_may_win():
    """K = 1 wins at 119 tok/s, K = 2 close behind at 116, plain decoding at 100 is priced
    out (below 85% of the winner): after each of K = 1's phases the turn of plain decoding
    is skipped for K = 2's probe, so in 600 steps K = 2 is probed about twice as often as
    when a skip doubled the phase instead (29 steps against 14)."""
    step = world(0.010, 0.0, 0.003, 0.55)
    c = SpeculationControl(modes=(2, 1, 0))
    run(c, step, 600)
    assert c.winner == 1 and c.skipped >= 4
    assert c.steps[2] >= 25 and c.steps[0] == c.probe_steps + 1   # plain decoding: the survey's measurement only


def test_the_catch_up_after_plain_decoding_is_not_measured():
    """After plain decoding, a drafter's first step cannot draft (it has not seen the tokens
    decoded plainly) and its second runs it over all of them: a step of K = 2 costs 16 ms
    and gives 2.19 tokens, but the two steps after a plain phase give 1 token in 10 ms and
    2.19 tokens in 40 ms. Those are left out, so K = 2's rate is its own (137 tok/s, plain
    decoding 100) and it wins."""
    steady = world(0.010, 0.0, 0.003, 0.7)
    c = SpeculationControl(modes=(2, 0))
    previous, since = None, 0
    for _ in range(3000):
        since = since + 1 if c.mode == previous else 0
        previous = c.mode
        seconds, tokens = steady(c.mode)
        if c.mode and since == 0 and c.steps[0]:
            seconds, tokens = 0.010, 1          # no drafts yet
        elif c.mode and since == 1 and c.steps[0]:
            seconds += 0.024                    # the catch-up
        c.record(seconds, tokens, measured=True)
    assert c.winner == 2 and c.rates[2] == pytest.approx(2.19 / 0.016)


def test_a_large_class_starts_plain_after_a_lone_stream_chose_drafts():
    """A server's first request ran alone and chose K = 4 (no cost model yet: plain decoding
    unmeasured there); 64 streams arriving next survey from plain decoding, not K = 4; a
    class of 2-3 streams still starts from the lone stream's verdict."""
    c = BatchSpeculationControl(modes=(4, 3, 2, 1, 0))
    one = c.for_batch(1)
    for _ in range(5):
        one.record(0.01, 3, measured=True)
    assert one.rates[4] is not None and one.model() is None
    assert c.for_batch(64).mode == 0 and c.for_batch(2).mode == 4


def test_steps_where_the_drafter_catches_up_on_a_prompt_are_not_measured(monkeypatch):
    """A drafter's first step after a prefill runs it over the whole prompt (tens of ms on a
    long one) and was measured as a step of the mode running then, so a long prompt made
    drafting look several times slower than it is. Steps whose drafter had more than the
    usual re-run waiting (the last token and the drafts kept) are now left out."""
    llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=2), adaptive_speculation=True)
    proposer, backlog, records = llm.engine.proposer, [0], []
    propose, record = proposer.propose, SpeculationControl.record

    def spy_propose(seqs, ks):   # the drafter runs every waiting re-run, drafting for it or not
        backlog[0] = max((len(row.tokens) for row in proposer.waiting.values()), default=0)
        return propose(seqs, ks)

    def spy_record(self, seconds, tokens, measured, **kw):
        records.append((backlog[0], measured))
        return record(self, seconds, tokens, measured, **kw)
    monkeypatch.setattr(proposer, "propose", spy_propose)
    monkeypatch.setattr(SpeculationControl, "record", spy_record)
    usual = 1 + max(proposer.max_draft_tokens, llm.spec.lookup_draft_tokens)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = ["def add(a, b):\n    return a + b\n" * 12, "import os\nimport sys\n" * 15, "x = 1\n" * 40]
    ref = [o.token_ids for o in LLM("default").generate(prompts, params)]
    assert [llm.generate([p], params)[0].token_ids for p in prompts[:2]] == ref[:2]
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    assert records[0][0] >= len(llm.tokenizer.encode(prompts[0]))   # the first step: K = 2, the prompt waiting
    caught_up = [measured for b, measured in records if b > usual]   # prompts, and catch-ups after plain phases
    assert caught_up and not any(caught_up)
    assert any(measured for b, measured in records if b <= usual)


class PlainAfterPrefill:
    """A stand-in control: K = 2 for the step that prefills, plain decoding after it."""
    def __init__(self):
        self.steps, self.measured = 0, []

    def for_batch(self, load):
        self.steps += 1
        return self

    @property
    def mode(self):
        return 2 if self.steps == 1 else 0

    @property
    def speculate(self):
        return self.mode != 0

    def record(self, seconds, tokens, measured, **kw):
        self.measured.append(measured)


def test_a_plain_step_that_runs_the_prompts_waiting_re_run_is_not_measured():
    """The prompt's re-run queued by a speculating prefill step runs in the next step even
    when that step decodes plainly (the drafter flushes what waits): not a plain step's cost."""
    llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=2), adaptive_speculation=True)
    llm.engine.spec_control = control = PlainAfterPrefill()
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = "def add(a, b):\n    return a + b\n" * 12
    assert llm.generate([prompt], params)[0].token_ids == LLM("default").generate([prompt], params)[0].token_ids
    assert control.measured == [False] + [True] * 6   # 7 decode steps after the prefill
