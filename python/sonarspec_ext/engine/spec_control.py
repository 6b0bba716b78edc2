"""Speculation that pays for itself: each decoding step drafts as many tokens as have
measured (or, from those measurements, are predicted to give) the highest throughput on
this machine, model and traffic - possibly none.

The modes are draft lengths, the configured one first, 0 meaning plain decoding. The
controller assumes throughput is unimodal in the draft length over K >= 1 (it rises while
the drafts' acceptance outweighs their cost, then falls) and climbs to the peak: it
surveys the start mode, then plain decoding (the baseline every draft must beat), then,
``probe_steps`` measured steps each, the unmeasured neighbours of the fastest mode so far,
until all of them are measured slower. Then decoding alternates between exploiting the
fastest mode and briefly probing a neighbour: ``phase_steps`` steps of the current winner,
then ``probe_steps`` of the next neighbour in turn, after which the faster of the two
runs; the winner's phases double (up to ``max_phase_steps``) each time a probe confirms it.

A cost model spares the probes that cannot win. Per sequence and step, a mode gives
``e(K)`` tokens and takes ``u(K)`` seconds; with plain decoding and a draft length measured,
``u`` is the least-squares line through the measured modes (each draft token adds
verification rows and drafting work to every sequence, so a step costs more in proportion)
and ``e`` follows the acceptance ``a`` of a geometric fit, ``e(K) = 1 + a + ... + a^K``. A
probe whose predicted rate ``e/u`` is below ``1 - margin`` of the winner's measured one is
skipped for the next neighbour in turn, and when all are skipped the phase doubles as if
one had lost - except once a phase has reached ``max_phase_steps``: then the probe runs,
so a changed regime is noticed. On a CPU with many streams, where a verification row
costs as much as a decoding one, this leaves one cheap survey instead of a probe of every
length.

A mode's rate is its tokens per step over its seconds per step, both per sequence: the
seconds averaged over the decode-only steps it ran (steps that also prefill are not
comparable and are not measured) and over its phases with weight ``decay`` on the past; the
tokens likewise until the first draft position has been seen often enough, then from the
acceptance per position pooled over all draft lengths (``DraftAcceptance``: a probe of a
few steps would otherwise rank lengths by the luck of its drafts). Steps that drafted from
the context (lookup drafts, as long as the repetition whatever the mode) are measured apart
and enter every draft length's rate at their share (``LookupSteps``). Every mode gives the
same tokens (speculation is lossless), so the choice only moves speed: at worst a probe's
share of steps runs a slower mode.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .draft_acceptance import DraftAcceptance, chain_tokens, geometric_acceptance
from .lookup_steps import LookupSteps


class SpeculationControl:
    def __init__(self, modes: Sequence[int] = (1, 0), phase_steps: int = 16, probe_steps: int = 4,
                 max_phase_steps: int = 512, decay: float = 0.5, margin: float = 0.15, pool_acceptance: bool = True,
                 prior_acceptance: Optional[Sequence[float]] = None):
        """``pool_acceptance`` False: each mode's rate is its steps' tokens over their seconds
        as measured, lookup steps included - nothing pooled across modes (batches of several
        sequences with lookup drafts: ``BatchSpeculationControl``). ``prior_acceptance``: the
        drafter's acceptance per position measured elsewhere, where the pooled estimate
        starts (``DraftAcceptance``)."""
        if (min(phase_steps, probe_steps) < 1 or max_phase_steps < phase_steps or not 0 <= decay < 1
                or len(modes) < 2 or len(set(modes)) != len(modes) or min(modes) < 0 or not 0 <= margin < 1):
            raise ValueError("SpeculationControl needs two or more distinct draft lengths >= 0, phase_steps, "
                             "probe_steps >= 1, max_phase_steps >= phase_steps, 0 <= decay < 1 and "
                             "0 <= margin < 1")
        self.modes = tuple(modes)
        self._ladder = sorted(self.modes)   # the modes by draft length: neighbours are adjacent
        self.phase_steps, self.probe_steps, self.max_phase_steps, self.decay, self.margin = (
            phase_steps, probe_steps, max_phase_steps, decay, margin)
        self.rates: Dict[int, Optional[float]] = dict.fromkeys(self.modes)   # draft length -> tokens/s
        # draft length -> (tokens, seconds) per sequence and step, averaged like the rates
        self.per_sequence: Dict[int, Optional[Tuple[float, float]]] = dict.fromkeys(self.modes)
        # drafts kept per position, all lengths pooled
        self.acceptance = DraftAcceptance(max(self.modes), prior_acceptance=prior_acceptance)
        self.pool_acceptance = pool_acceptance
        self.lookup_steps = LookupSteps()   # steps that drafted from the context, all lengths
        self.prior: Optional[Tuple[float, float]] = None   # (acceptance, slope) from elsewhere
        self.steps: Dict[int, int] = dict.fromkeys(self.modes, 0)            # decode steps run in each mode
        self.skipped = 0              # probes the cost model spared
        self.winner = self.modes[0]   # the configured draft length until measured otherwise
        self.mode = self.winner       # the next step's
        self._surveying = True        # climbing to the fastest mode, before the first phase
        self._probe = 0               # which neighbour of the winner the next probe runs
        self._left = probe_steps      # measured steps left in this phase
        self._exploit = phase_steps   # length of the winner's next phase
        self._seconds = 0.0
        self._tokens = 0
        self._sequences = 0
        self._unsettled = 0           # steps after a switch left unmeasured

    def start_with(self, mode: int, prior: Optional[Tuple[float, float]] = None) -> None:
        """Start the survey from ``mode`` (a verdict from elsewhere) instead; ``prior``:
        the (acceptance, slope) of another controller's cost model, used until this one
        has its own."""
        if self.rates[self.mode] is None:
            self.winner = self.mode = mode
            self.prior = prior

    def _neighbours(self, mode: int) -> List[int]:
        """Plain decoding and the modes next to ``mode`` in draft length, the shorter first:
        plain decoding has no drafting cost at all, so a drafter's fixed cost per step can
        make K = 1 slower than both plain decoding and K = 2 (throughput is unimodal over
        K >= 1); and it is the baseline the cost model prices the drafts from."""
        i = self._ladder.index(mode)
        near = [self._ladder[j] for j in (i - 1, i + 1) if 0 <= j < len(self._ladder)]
        return [0] + near if mode != 0 and 0 in self.modes and 0 not in near else near

    @property
    def probing(self) -> bool:
        return self.mode != self.winner

    @property
    def speculate(self) -> bool:
        """Whether the next step drafts at all."""
        return self.mode != 0

    def model(self) -> Optional[Tuple[float, float]]:
        """(acceptance, slope): the geometric acceptance fitted to the measured draft lengths'
        tokens per sequence and step (their mean), and the seconds per sequence and step each
        draft token adds (the least-squares line through the measured modes, plain decoding
        included, at least 0). The prior until plain decoding and a draft length are measured."""
        measured = {m: v for m, v in self.per_sequence.items() if v is not None}
        spec = [m for m in measured if m > 0]
        if not spec or 0 not in measured:
            return self.prior
        acceptance = sum(geometric_acceptance(measured[m][0], m) for m in spec) / len(spec)
        mean_k = sum(measured) / len(measured)
        mean_u = sum(u for _, u in measured.values()) / len(measured)
        slope = (sum((k - mean_k) * (measured[k][1] - mean_u) for k in measured)
                 / sum((k - mean_k) ** 2 for k in measured))
        return acceptance, max(slope, 0.0)

    def predicted_rate(self, mode: int) -> Optional[float]:
        """A mode's measured tokens/s, else the cost model's prediction (None: too little known)."""
        if self.rates[mode] is not None:
            return self.rates[mode]
        model = self.model()
        if model is None or self.per_sequence.get(0) is None:
            return None
        acceptance, slope = model
        pooled = self.acceptance.tokens_per_step(mode) if self.pool_acceptance else None
        return self._rate(mode, pooled or chain_tokens(acceptance, mode), self.per_sequence[0][1] + slope * mode)

    def _rate(self, mode: int, tokens: float, seconds: float) -> float:
        """Tokens/s of ``mode`` from its chain steps' tokens and seconds per sequence, its
        lookup steps at their share (drafting modes, when pooling)."""
        if mode > 0 and self.pool_acceptance:
            return self.lookup_steps.rate(tokens, seconds)
        return tokens / seconds

    def _worth_probing(self, mode: int) -> bool:
        rate = self.predicted_rate(mode)
        return rate is None or rate >= (1 - self.margin) * self.rates[self.winner]

    def record(self, seconds: float, tokens: int, measured: bool, sequences: int = 1,
               accepted: Optional[Sequence[int]] = None, lookup: Optional[Sequence[bool]] = None) -> None:
        """One step's wall time and output tokens over its ``sequences`` decoding sequences;
        ``measured``: a decode-only step. The first step of a phase is not measured, nor
        the second after plain decoding: they pay for the switch (a drafter catching up on
        the tokens decoded without it).
        ``accepted``: the drafts each decoding sequence kept, which every step adds to the
        pooled per-position acceptance (``DraftAcceptance``) whatever its draft length.
        ``lookup``: per decoding sequence, whether its drafts came from the context; a step
        with any such sequence is measured as a lookup step (``LookupSteps``), and only the
        others' drafts count towards the acceptance per position."""
        mode = self.mode
        self.steps[mode] += 1
        looked = self.pool_acceptance and mode > 0 and lookup is not None and any(lookup)
        if accepted is not None:
            self.acceptance.record(mode, [a for a, x in zip(accepted, lookup) if not x] if looked else accepted)
        if mode > 0:
            self.lookup_steps.count(looked)
        if self._unsettled:
            self._unsettled -= 1
            return
        if not measured or seconds <= 0:
            return
        if looked:   # not the mode's measurement: the rates blend it in at the phase's end
            self.lookup_steps.record(tokens / max(sequences, 1), seconds / max(sequences, 1))
            return
        self._seconds += seconds
        self._tokens += tokens
        self._sequences += max(sequences, 1)
        self._left -= 1
        if self._left > 0:
            return
        now = (self._tokens / self._sequences, self._seconds / self._sequences)
        old = self.per_sequence[mode]
        tokens_per, seconds_per = now if old is None else (
            self.decay * o + (1 - self.decay) * n for o, n in zip(old, now))
        self.per_sequence[mode] = (tokens_per, seconds_per)
        self._update_rates()
        self._seconds, self._tokens, self._sequences = 0.0, 0, 0
        if self._surveying:   # climb: the fastest so far, and its neighbours not yet measured
            self.winner = max((m for m in self.modes if self.rates[m] is not None), key=lambda m: self.rates[m])
            todo = [m for m in self._neighbours(self.winner) if self.rates[m] is None]
            worth = [m for m in todo if self._worth_probing(m)]
            self._surveying = bool(worth)
            if not worth:   # the survey's end: the unmeasured neighbours it spared
                self.skipped += len(todo)
            self.mode, self._left = (worth[0], self.probe_steps) if worth else (self.winner, self._exploit)
        elif self.probing:   # the probe's verdict: the faster mode runs next, longer if it won again
            if self.rates[mode] > self.rates[self.winner]:
                self.winner, self._exploit = mode, self.phase_steps
            else:
                self._exploit = min(self.max_phase_steps, 2 * self._exploit)
            self.mode, self._left = self.winner, self._exploit
        else:                 # the winner's phase is over: probe one of its neighbours
            self.mode, self._left = self._next_probe()
        # A switch costs the step after it (the drafter catching up); from plain decoding
        # the next one too: the first cannot draft (the drafter has not seen the tokens
        # decoded plainly) and the second runs it over all of them (deferred refills).
        self._unsettled = 0 if self.mode == mode else 2 if mode == 0 else 1

    def _update_rates(self) -> None:
        """Each measured mode's tokens/s: its tokens per step - from the pooled acceptance
        once it has enough samples, else as measured - over its measured seconds per step."""
        for m, measured in self.per_sequence.items():
            if measured is not None:
                pooled = self.acceptance.tokens_per_step(m) if m > 0 and self.pool_acceptance else None
                self.rates[m] = self._rate(m, measured[0] if pooled is None else pooled, measured[1])

    def _next_probe(self) -> Tuple[int, int]:
        """(mode, steps) after the winner's phase: the next neighbour in turn that the cost
        model does not price as a loser (any, once the phases are at their longest) - or,
        if it prices them all as losers, the winner's next phase, doubled as if a probe had
        confirmed it. A neighbour priced out (plain decoding, say) does not delay the probe
        of one that may win."""
        near = self._neighbours(self.winner)
        for _ in range(len(near)):
            mode = near[self._probe % len(near)]
            self._probe += 1
            if self._exploit >= self.max_phase_steps or self._worth_probing(mode):
                return mode, self.probe_steps
            self.skipped += 1
        self._exploit = min(self.max_phase_steps, 2 * self._exploit)
        return self.winner, self._exploit


class BatchSpeculationControl:
    """One ``SpeculationControl`` per size class of the decoding batch (1, 2-3, 4-7, ...,
    32 and more sequences; a class keeps a batch a little beyond its range, see ``_holds``):
    speculation that pays for one stream rarely pays for 32, so each class learns its own
    winner, and the losing modes' probes there grow rare. A class seen for the first time
    starts its survey from plain decoding with the cost model of the nearest smaller class
    that has one (a larger batch's drafts cost at least as much per sequence, so the
    borrowed model errs towards probing them); without one, a class of ``PLAIN_FROM_CLASS``
    or more starts from plain decoding, a smaller one from the winner of the nearest class
    that has measured a mode (the first to measure: from the configured draft length). A
    survey that opens with K drafts for each of 64 sequences verifies 64 (1 + K) rows per
    step, steps that cost several plain ones where the target is compute-bound; from plain
    decoding it climbs through K = 1 instead, and only as far as drafts pay - also when a
    server's first requests ran alone with K drafts a moment before.

    ``lookup_drafts`` (the drafter may draft from the context): a batch of one measures its
    lookup steps apart (``LookupSteps``); in a larger batch nearly every step has some
    sequence drafting from the context, so its classes take each mode's steps as measured,
    lookup steps included (``pool_acceptance`` False) - the luck of many sequences' drafts
    averages out within each step."""

    LAST_CLASS = 6   # 32 and more sequences
    PLAIN_FROM_CLASS = 3   # 4 and more sequences

    def __init__(self, lookup_drafts: bool = False, **kwargs):
        self._kwargs = kwargs
        self.lookup_drafts = lookup_drafts
        SpeculationControl(**kwargs)   # validates the settings
        self.classes: Dict[int, SpeculationControl] = {}
        self._last: Optional[int] = None   # the previous step's class

    @staticmethod
    def _holds(c: int, n: int) -> bool:
        """Whether class c (sizes 2^(c-1) .. 2^c - 1; the last one unbounded) keeps a batch of
        n: its range widened by a quarter of its lower bound on each side, so that a batch
        moving by one or two across a boundary (16 clients: 15, 16, 15, ...) does not switch
        class - and verdict, each switch to speculation making the drafter catch up - every
        few steps."""
        lo, slack = 1 << (c - 1), (1 << (c - 1)) // 4
        return lo - slack <= n and (c == BatchSpeculationControl.LAST_CLASS or n <= 2 * lo - 1 + slack)

    def for_batch(self, num_decoding: int) -> SpeculationControl:
        n = max(num_decoding, 1)
        held = self._last is not None and self._holds(self._last, n)
        c = self._last if held else min(n.bit_length(), self.LAST_CLASS)
        self._last = c
        if c not in self.classes:
            kwargs = dict(self._kwargs, pool_acceptance=False) if self.lookup_drafts and c > 1 else self._kwargs
            new = SpeculationControl(**kwargs)
            smaller = [k for k in self.classes if k < c and self.classes[k].model() is not None]
            prior = self.classes[max(smaller)].model() if smaller and 0 in new.modes else None
            seen = [k for k in self.classes if any(r is not None for r in self.classes[k].rates.values())]
            if prior is not None:
                new.start_with(0, prior)
            elif c >= self.PLAIN_FROM_CLASS and 0 in new.modes:
                new.start_with(0)
            elif seen:   # a verdict, not a start that has measured nothing (a class of prefill steps)
                new.start_with(self.classes[min(seen, key=lambda k: (abs(k - c), k))].winner)
            self.classes[c] = new
        return self.classes[c]

    def summary(self) -> dict:
        """Decode steps run speculating and plainly, probes the cost model spared, and per
        class each draft length's measured tokens/s and decode steps (0: plain decoding)."""
        steps = [c.steps for c in self.classes.values()]
        return {"speculating_steps": sum(n for s in steps for m, n in s.items() if m),
                "plain_steps": sum(s.get(0, 0) for s in steps),
                "skipped_probes": sum(c.skipped for c in self.classes.values()),
                "classes": {f"{1 << (k - 1)}+": dict(c.rates) for k, c in sorted(self.classes.items())},
                "class_steps": {f"{1 << (k - 1)}+": dict(c.steps) for k, c in sorted(self.classes.items())}}
