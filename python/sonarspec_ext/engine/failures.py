"""A failed engine step: the sequences it ran finish with an error and give their pages
back, and the engine serves everything else (``Engine.step``)."""
from __future__ import annotations

import logging

log = logging.getLogger("sonarspec")


def fail_step(engine, error: BaseException) -> None:
    """Finishes the sequences of ``engine``'s failed step with reason ``"error"`` (the
    exception's text in ``error``) - every unfinished sequence where the step failed before
    scheduling any (its planning failed, and would fail again at every retry) - after
    waiting out a plan made ahead; a sequence whose finishing fails too still releases its
    pages."""
    failed = engine._step_seq_ids
    if not failed and isinstance(error, Exception):   # planning failed: no retry gets past it
        failed = [sid for sid, seq in engine.seqs.items() if not seq.finished]
    log.error("engine step failed (%s: %s); %d request(s) finish with an error", type(error).__name__, error,
              len(failed), exc_info=error)
    if engine._next_plan is not None:
        try:
            engine._next_plan.wait()
        finally:
            engine._next_plan = None
    for sid in failed:
        seq = engine.seqs.get(sid)
        if seq is not None and not seq.finished:
            seq.error = f"{type(error).__name__}: {error}"
            try:
                engine.output.finish(seq, "error")
            except Exception:   # the state that failed may fail again: free the pages regardless
                seq.finish_reason = "error"
                if engine.planner.has(sid):
                    engine.planner.finish(sid)
