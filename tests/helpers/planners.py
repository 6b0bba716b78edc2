"""A native planner for the planner tests, its configuration in keyword arguments."""
from sonarspec_ext import _C


def make_planner(num_pages=32, page_size=4, max_num_seqs=8, budget=64, max_len=256, caching=False):
    c = _C.PlannerConfig()
    c.num_pages, c.page_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len = (
        num_pages, page_size, max_num_seqs, budget, max_len)
    c.enable_prefix_caching = caching
    return _C.Planner(c)
