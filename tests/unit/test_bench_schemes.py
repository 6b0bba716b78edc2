"""The profiling tools' scheme names (``bench.spec.scheme_config``)."""
import pytest

from sonarspec_ext.bench.spec import scheme_config


def test_scheme_names_give_their_configs():
    assert scheme_config("plain").method == "none"
    mtp = scheme_config("mtp:3")
    assert (mtp.method, mtp.num_draft_tokens) == ("mtp", 3)
    assert scheme_config("draft_target").num_draft_tokens == 4
    tree = scheme_config("eagle_tree:3:2:6")
    assert (tree.method, tree.num_draft_tokens, tree.tree_top_k, tree.tree_num_nodes) == ("eagle_tree", 3, 2, 6)
    q = scheme_config("mtp:2@q8_0")
    assert (q.method, q.num_draft_tokens, q.quantization) == ("mtp", 2, "q8_0")
    assert scheme_config("eagle_tree:2:2:4@q4_1").quantization == "q4_1"
    lk = scheme_config("mtp:3+8@q8_0")
    assert (lk.num_draft_tokens, lk.lookup_draft_tokens, lk.quantization) == (3, 8, "q8_0")


@pytest.mark.parametrize("name", ["mtp:x", "mtp:2@nonsense", "unknown:2", "mtp:2:5", "eagle_tree:3:2",
                                  "mtp:3+x", "ngram:3+4"])
def test_bad_scheme_names_are_refused(name):
    with pytest.raises(ValueError):
        scheme_config(name)
