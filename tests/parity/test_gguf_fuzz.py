"""GGUF files are user input: randomly corrupted copies of a tiny model's file (bytes flipped
and integers overwritten in its header, metadata and tensor index, copies cut short, bytes
flipped in its tensor data), seeded. Loading each - the model and its tokenizer, as
``LLM(model=FILE)`` does - either works or raises CheckpointError; nothing else escapes."""
import random
import struct

import pytest

gguf = pytest.importorskip("gguf")

from helpers.gguf_fixtures import write_gguf  # noqa: E402
from helpers.models import make_hf_model  # noqa: E402
from sonarspec_ext.models.config import CheckpointError  # noqa: E402
from sonarspec_ext.models.gguf_reader import GGUFFile  # noqa: E402
from sonarspec_ext.models.loader import load_model, load_tokenizer  # noqa: E402

EXTREMES = [0, 1, 2 ** 31 - 1, 2 ** 32 - 1, 2 ** 63, 2 ** 64 - 1]


def _mutate(data: bytes, index_end: int, rng: random.Random):
    """(a description, the corrupted copy) of the file's bytes."""
    out = bytearray(data)
    kind = rng.choice(["flip", "flip", "u32", "u64", "cut", "data"])
    if kind == "cut":
        at = rng.randrange(len(data))
        return f"cut at {at}", bytes(out[:at])
    if kind == "data":   # the tensor data: weights change, the file stays well formed
        at = rng.randrange(index_end, len(data))
        out[at] ^= 1 << rng.randrange(8)
        return f"data bit at {at}", bytes(out)
    if kind == "flip":
        spots = [rng.randrange(4, index_end) for _ in range(rng.randint(1, 4))]   # past the magic
        for at in spots:
            out[at] = rng.randrange(256)
        return f"bytes at {spots}", bytes(out)
    size, fmt = (4, "<I") if kind == "u32" else (8, "<Q")
    at = rng.randrange(4, index_end - size)
    value = rng.choice(EXTREMES + [rng.randrange(1 << (8 * size))])
    struct.pack_into(fmt, out, at, value % (1 << (8 * size)))
    return f"{kind} {value} at {at}", bytes(out)


@pytest.mark.parametrize("qtype", [None, "Q8_0"])
def test_corrupted_gguf_files_load_or_raise_checkpoint_error(tmp_path, qtype):
    hf = str(tmp_path / "hf")
    make_hf_model(hf, "llama", seed=5, tie_word_embeddings=False, num_key_value_heads=2)
    good = write_gguf(hf, str(tmp_path / "good.gguf"),
                      qtype=None if qtype is None else getattr(gguf.GGMLQuantizationType, qtype))
    data = open(good, "rb").read()
    index_end = min(t.data_offset for t in GGUFFile(good).tensors)   # header, metadata, tensor index, padding
    rng = random.Random(0 if qtype is None else 1)
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(80):
        what, content = _mutate(data, index_end, rng)
        path = str(tmp_path / f"m{i}.gguf")
        with open(path, "wb") as fh:
            fh.write(content)
        try:
            load_model(path)
            load_tokenizer(path)
            outcomes["loaded"] += 1
        except CheckpointError:
            outcomes["refused"] += 1
        except Exception as e:   # noqa: BLE001 - anything else is the finding
            pytest.fail(f"{what}: {type(e).__name__}: {e}")
    assert outcomes["loaded"] >= 10 and outcomes["refused"] >= 10, outcomes   # both sides were reached
