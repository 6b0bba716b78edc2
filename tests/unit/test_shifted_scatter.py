"""ops.shifted_scatter (native CPU, and CUDA where present) against its torch reference."""
import pytest
import torch

from sonarspec_ext import _C, ops
from sonarspec_ext.testing.reference import shifted_scatter_reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and _C.cuda_available() else [])


def _random_blocks(num_blocks, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 9, (num_blocks,), generator=g)
    starts = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), lens[:-1]]), 0)
    accepted = (torch.rand(num_blocks, generator=g) * lens).long()
    ids = torch.randint(0, 32000, (int(lens.sum()),), generator=g)
    nxt = torch.randint(0, 32000, (num_blocks,), generator=g)
    return ids, starts, lens, nxt, accepted


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_blocks", [1, 7, 99])
def test_matches_reference(device, num_blocks):
    args = [t.to(device) for t in _random_blocks(num_blocks, num_blocks)]
    got = ops.shifted_scatter(*args)
    assert torch.equal(got.cpu(), shifted_scatter_reference(*[a.cpu() for a in args]))


def test_exact_small_case():
    # blocks [10 11] [12 13 14] [15]: accepted 1, 0, 0; next tokens 7, 8, 9
    got = ops.shifted_scatter(torch.arange(10, 16), torch.tensor([0, 2, 5]), torch.tensor([2, 3, 1]),
                              torch.tensor([7, 8, 9]), torch.tensor([1, 0, 0]))
    assert got.tolist() == [11, 7, 8, 14, 8, 9]


def test_out_of_range_accepted_leaves_the_block():
    ids = torch.arange(6)
    got = ops.shifted_scatter(ids, torch.tensor([0, 3]), torch.tensor([3, 3]), torch.tensor([50, 60]),
                              torch.tensor([3, 1]))
    assert got.tolist() == [0, 1, 2, 4, 60, 60]


def test_rejects_bad_tensors():
    ids, starts, lens, nxt, acc = _random_blocks(3, 0)
    with pytest.raises(ValueError, match="input_ids has dtype"):
        ops.shifted_scatter(ids.int(), starts, lens, nxt, acc)
    with pytest.raises(ValueError, match="accepted has 2 entries"):
        ops.shifted_scatter(ids, starts, lens, nxt, acc[:2])
    with pytest.raises(ValueError, match="block_lens must have 1 dimensions"):
        ops.shifted_scatter(ids, starts, lens[None], nxt, acc)
    with pytest.raises(ValueError, match="input_ids must be contiguous"):
        ops.shifted_scatter(torch.stack([ids, ids], 1)[:, 0], starts, lens, nxt, acc)
