"""Property-based fuzzing of the native step-metadata builders (hypothesis, seeded):
``_C.build_metadata`` over random rows (start, num_query, page table), draft-tree blocks,
page sizes and sliding windows, and ``_C.Planner.build_metadata`` over a live planner's
sequences - with values sometimes negative, past the page table, past int32 or not integers.
Oracles: an independent statement of the documented rules decides whether a call is valid;
a valid call returns exactly what ``reference_planner.build_metadata_reference`` (numpy)
builds, an invalid one raises ValueError. Run as fuzz_stack_script is."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fuzz_ops_script import COMPUTED, SETTINGS
from planners import assert_same_metadata, make_planner
from sonarspec_ext import _C
from sonarspec_ext.runtime.metadata import TREE_MAX_NODES, TreeBlock
from sonarspec_ext.testing.reference_planner import build_metadata_reference

INT32_MAX = 2 ** 31 - 1
ODD = st.sampled_from([INT32_MAX, -2 ** 31, 2 ** 31, 2 ** 40, -(2 ** 63), 2 ** 64, 1.5, "3"])


def value(lo, hi):
    """Mostly in [lo, hi]; sometimes at or past int32's limits, or not an integer."""
    return st.one_of(st.integers(lo, hi), st.integers(lo, hi), st.integers(lo, hi), st.integers(lo, hi), ODD)


def is_int32(v, lo=-2 ** 31):
    return isinstance(v, int) and lo <= v <= INT32_MAX


@st.composite
def rows_and_trees(draw):
    """Three examples in four keep to valid ranges (the checks must let them through); the
    rest draw every field from ranges with invalid values in them."""
    dirty = draw(st.integers(0, 3)) == 0
    num = (lambda lo, hi: value(lo, hi)) if dirty else (lambda lo, hi: st.integers(max(lo, 0), hi))
    page_size = draw(st.sampled_from([1, 2, 4, 16, 16] + ([0, -3, INT32_MAX] if dirty else [])))
    rows, trees = [], []
    for _ in range(draw(st.integers(1, 5))):
        start, n = draw(num(-2, 40)), draw(num(1, 9) if not dirty else num(-1, 9))
        need = -(-(start + n) // page_size) if is_int32(start) and is_int32(n) and page_size > 0 else 2
        count = max(0, min(need, 20) + (draw(st.integers(-1, 2)) if dirty else draw(st.integers(0, 2))))
        page = value(0, 63) if dirty else st.integers(0, 63)
        table = draw(st.lists(page, min_size=count, max_size=count))
        rows.append((start, n, table))
        tree = None
        if draw(st.booleans()) and is_int32(start, 0) and is_int32(n, 1) and n <= 70:
            begin = draw(st.integers(max(0, start + n - TREE_MAX_NODES), start) if not dirty
                         else st.one_of(st.integers(max(0, start - 8), start + 1), ODD))
            length = n if not dirty or draw(st.integers(0, 4)) else n + 1
            width = start + n - begin if is_int32(begin) and 0 < start + n - begin < 63 else 63
            bits = draw(st.lists(st.integers(0, 2 ** width - 1), min_size=length, max_size=length))
            far = ODD.filter(lambda v: isinstance(v, int) and -(2 ** 63) <= v < 2 ** 63)
            position = st.one_of(st.integers(0, 50), st.integers(0, 50), far) if dirty else st.integers(0, 50)
            positions = draw(st.lists(position, min_size=length, max_size=length))
            tree = (begin, np.array(bits, dtype=np.int64), np.array(positions, dtype=np.int64))
        trees.append(tree)
    return page_size, rows, trees if any(t is not None for t in trees) else None


def valid(page_size, rows, trees):
    """The documented rules, stated apart from the native code."""
    if page_size < 1:
        return False
    for b, (start, n, table) in enumerate(rows):
        if not (is_int32(start, 0) and is_int32(n, 1) and all(is_int32(p, 0) for p in table)):
            return False
        if len(table) * page_size < start + n:
            return False
        tree = None if trees is None else trees[b]
        if tree is not None:
            begin, bits, positions = tree
            if not (is_int32(begin, 0) and begin <= start and start + n - begin <= TREE_MAX_NODES):
                return False
            if len(bits) != n or len(positions) != n or not all(0 <= p <= INT32_MAX for p in positions.tolist()):
                return False
    return True


@SETTINGS
@given(case=rows_and_trees(), window=st.sampled_from([0, 0, 3, 20, -1]), want_mask=st.booleans())
def fuzz_build_metadata(case, window, want_mask):
    page_size, rows, trees = case
    ok = valid(page_size, rows, trees)
    try:
        got = _C.build_metadata(rows, trees, page_size, window, want_mask)
    except ValueError:
        assert not ok, f"a valid call was refused: {case}"
        return
    assert ok, f"an invalid call returned: {case}"
    blocks = None if trees is None else [None if t is None else TreeBlock(*t) for t in trees]
    want = build_metadata_reference(rows, page_size, window if window > 0 else None, blocks, want_mask)
    assert_same_metadata(got, want, case)
    COMPUTED["fuzz_build_metadata"] = COMPUTED.get("fuzz_build_metadata", 0) + 1


def _planner():
    p = make_planner(num_pages=32, page_size=4, max_num_seqs=4, budget=64, max_len=64)
    for sid, n in ((0, 9), (1, 3), (2, 14)):
        p.add_request(sid, n)
    p.schedule(2)
    return p


PLANNER = _planner()


CLEAN_ROW = st.tuples(st.integers(0, 2), st.integers(0, 8), st.integers(1, 4))
DIRTY_ROW = st.tuples(st.integers(-1, 3), value(-2, 16), value(-1, 6))


@SETTINGS
@given(rows=st.lists(st.one_of(CLEAN_ROW, CLEAN_ROW, CLEAN_ROW, DIRTY_ROW), min_size=1, max_size=4),
       window=st.sampled_from([0, 5]), want_mask=st.booleans())
def fuzz_planner_metadata(rows, window, want_mask):
    ints = all(isinstance(v, int) and -(2 ** 63) <= v < 2 ** 63 for r in rows for v in r)
    if not ints:   # the planner's entry point takes int64 arrays: other values never reach it
        return
    arrays = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(3)]
    known = all(PLANNER.has(sid) for sid, _, _ in rows)
    tables = [PLANNER.page_table(sid) if PLANNER.has(sid) else [] for sid, _, _ in rows]
    ok = known and valid(PLANNER.page_size, [(s, n, t) for (_, s, n), t in zip(rows, tables)], None)
    try:
        got = PLANNER.build_metadata(*arrays, None, window, want_mask)
    except ValueError:
        assert not ok, f"a valid call was refused: {rows}"
        return
    assert ok, f"an invalid call returned: {rows}"
    want = build_metadata_reference([(s, n, t) for (_, s, n), t in zip(rows, tables)], PLANNER.page_size,
                                    window or None, None, want_mask)
    assert_same_metadata(got, want, rows)
    COMPUTED["fuzz_planner_metadata"] = COMPUTED.get("fuzz_planner_metadata", 0) + 1


if __name__ == "__main__":
    for fuzz in (fuzz_build_metadata, fuzz_planner_metadata):
        fuzz()
        print(f"fuzzed {fuzz.__name__} computed", COMPUTED.get(fuzz.__name__, 0), flush=True)
