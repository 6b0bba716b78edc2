"""A native planner for the planner tests, its configuration in keyword arguments, and the
comparison of a step-metadata dict with the numpy reference's."""
import numpy as np

from sonarspec_ext import _C


def make_planner(num_pages=32, page_size=4, max_num_seqs=8, budget=64, max_len=256, caching=False):
    c = _C.PlannerConfig()
    c.num_pages, c.page_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len = (
        num_pages, page_size, max_num_seqs, budget, max_len)
    c.enable_prefix_caching = caching
    return _C.Planner(c)


def assert_same_metadata(got: dict, want: dict, what) -> None:
    """``got`` (a native metadata dict) equal to ``want`` (``build_metadata_reference``'s) in
    every entry; the dense mask compared as booleans."""
    for key, value in want.items():
        if key == "mask":
            assert (value is None) == (got[key] is None), (what, key)
            if value is not None:
                assert np.array_equal(got[key].astype(bool), value), (what, key)
        elif isinstance(value, np.ndarray):
            assert np.array_equal(got[key], value), (what, key, got[key], value)
        else:
            assert got[key] == value, (what, key, got[key], value)
