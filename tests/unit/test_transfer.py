"""``engine.transfer.to_device``: host arrays through one packed buffer (the CUDA path,
taken here on the CPU) come back with their contents, dtypes and shapes."""
import numpy as np
import torch

from sonarspec_ext.runtime.transfer import to_device


def test_packed_transfer_keeps_every_array():
    rng = np.random.default_rng(0)
    arrays = [rng.integers(-2**40, 2**40, size=(3, 5)), None, rng.random((2, 1, 3, 7)) < 0.5,
              np.arange(0, dtype=np.int64), rng.integers(0, 9, size=7), np.asarray([[1, 2], [3, 4]]).T,
              np.ones(3, dtype=np.float32)]
    for pack in (True, False):
        out = to_device(arrays, "cpu", pack=pack)
        assert out[1] is None
        for a, t in zip(arrays, out):
            if a is not None:
                ref = torch.from_numpy(np.ascontiguousarray(a))
                assert t.dtype == ref.dtype and t.shape == ref.shape and torch.equal(t, ref)
    packed = to_device(arrays, "cpu", pack=True)
    assert packed[2].data_ptr() - packed[0].data_ptr() == 3 * 5 * 8   # one buffer, int64 data first
    assert packed[4].data_ptr() % 8 == 0                               # aligned after the odd-sized bool mask
    assert to_device([], "cpu", pack=True) == [] and to_device([None], "cpu", pack=True) == [None]
