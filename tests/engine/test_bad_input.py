"""Bad input gets a ValueError that says what is wrong; the engine keeps serving."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from sonarspec_ext import LLM, CheckpointError, SamplingParams, SpecConfig
from sonarspec_ext.models.loader import load_model


@pytest.fixture
def model_copy(llama_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(llama_dir, d)
    return str(d)


def test_truncated_safetensors(model_copy):
    f = os.path.join(model_copy, "model.safetensors")
    data = open(f, "rb").read()
    open(f, "wb").write(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: corrupt or truncated"):
        load_model(model_copy)


def test_garbage_safetensors(model_copy):
    open(os.path.join(model_copy, "model.safetensors"), "wb").write(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_model(model_copy)


def test_missing_and_misshapen_tensor(model_copy):
    f = os.path.join(model_copy, "model.safetensors")
    state = load_file(f)
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, f)
    with pytest.raises(CheckpointError, match="missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        load_model(model_copy)
    state["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(state, f)
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.up_proj.weight' has shape \[3, 3\], "
                                              r"expected \[96, 64\]"):
        load_model(model_copy)


def test_sharded_checkpoint_loads_and_names_missing_shard(model_copy):
    f = os.path.join(model_copy, "model.safetensors")
    state = load_file(f)
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, os.path.join(model_copy, fname))
    os.remove(f)
    with open(os.path.join(model_copy, "model.safetensors.index.json"), "w") as fh:
        json.dump({"weight_map": {k: fname for fname, keys in shards.items() for k in keys}}, fh)
    ref = load_model(model_copy)
    assert torch.equal(ref.model.norm.weight, state["model.norm.weight"])
    os.remove(os.path.join(model_copy, "model-00002-of-00002.safetensors"))
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors: file not found"):
        load_model(model_copy)


def test_missing_files_and_bad_config(model_copy, tmp_path):
    with pytest.raises(CheckpointError, match="model directory or GGUF file not found"):
        LLM(str(tmp_path / "nope"))
    cfg_file = os.path.join(model_copy, "config.json")
    cfg = json.load(open(cfg_file))
    json.dump({**cfg, "architectures": ["GPT2LMHeadModel"]}, open(cfg_file, "w"))
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel.*not supported"):
        load_model(model_copy)
    del cfg["hidden_size"]
    json.dump(cfg, open(cfg_file, "w"))
    with pytest.raises(CheckpointError, match="missing required field 'hidden_size'"):
        load_model(model_copy)
    open(cfg_file, "w").write("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_model(model_copy)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"), (dict(max_tokens=0), "max_tokens"), (dict(seed="x"), "seed"),
    (dict(temperature=float("nan")), "temperature"), (dict(stop=[""]), "stop"),
])
def test_invalid_sampling_params(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kwargs)


def test_invalid_spec_and_engine_config(llama_dir):
    with pytest.raises(ValueError, match="method"):
        SpecConfig(method="magic")
    with pytest.raises(ValueError, match="page_size"):
        LLM(llama_dir, page_size=0)
    with pytest.raises(ValueError, match="dtype"):
        LLM(llama_dir, dtype="int8")
    with pytest.raises(ValueError, match="enable_prefix_caching must be True or False, got 'no'"):
        LLM(llama_dir, enable_prefix_caching="no")
    with pytest.raises(ValueError, match="model must be a model name, a directory or a GGUF file path, got NoneType"):
        LLM(None)


def test_bad_prompts_leave_other_requests_untouched(llama_dir):
    llm = LLM(llama_dir, max_model_len=64)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    ref = llm.generate([[1, 2, 3], [4, 5]], params)
    eng = llm.engine
    ids = [eng.add_request([1, 2, 3], params)]
    eng.step()
    for bad, msg in [([], "empty"), ("", "empty"), ([1] * 64, "prompt has 64 tokens but the context holds 64"),
                     ([1, 99999], "outside the vocabulary"), (3.5, "string or a list")]:
        with pytest.raises(ValueError, match=msg):
            eng.add_request(bad, params)
    with pytest.raises(ValueError, match="SamplingParams"):
        eng.add_request([1], {"temperature": 0})
    ids.append(eng.add_request([4, 5], params))
    while eng.has_unfinished():
        eng.step()
    assert [eng.pop_finished(i).output_ids for i in ids] == [o.token_ids for o in ref]
    with pytest.raises(ValueError, match="prompt 1: .*empty"):
        llm.generate([[1, 2], []], params)
    assert not eng.has_unfinished() and eng.planner.num_free_pages == eng.kv_cache.num_pages


def test_generation_stops_at_context_limit(llama_dir):
    llm = LLM(llama_dir, max_model_len=20)
    out = llm.generate([[1] * 15], SamplingParams(max_tokens=100, temperature=0, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_integer_weights_and_configs_out_of_range_are_refused(model_copy):
    f = os.path.join(model_copy, "model.safetensors")
    state = load_file(f)
    name = next(n for n in state if n.endswith("mlp.up_proj.weight"))
    state[name] = state[name].to(torch.int8)
    save_file(state, f)
    with pytest.raises(CheckpointError, match=f"{name}' has dtype torch.int8"):
        load_model(model_copy)
    cfg_file = os.path.join(model_copy, "config.json")
    cfg = json.load(open(cfg_file))
    for bad, msg in [([cfg], "expected a JSON object, got a list"), ({**cfg, "hidden_size": -64}, "hidden_size"),
                     ({**cfg, "num_hidden_layers": 0}, "num_hidden_layers"),
                     ({**cfg, "max_position_embeddings": 0}, "max_position_embeddings"),
                     ({**cfg, "eos_token_id": "x"}, "eos_token_id must be a token id")]:
        json.dump(bad, open(cfg_file, "w"))
        with pytest.raises(CheckpointError, match=msg):
            load_model(model_copy)


def test_weight_index_outside_the_model_directory_is_refused(model_copy, tmp_path):
    os.rename(os.path.join(model_copy, "model.safetensors"), tmp_path / "elsewhere.safetensors")
    index = {"weight_map": {n: str(tmp_path / "elsewhere.safetensors")
                            for n in load_file(str(tmp_path / "elsewhere.safetensors"))}}
    json.dump(index, open(os.path.join(model_copy, "model.safetensors.index.json"), "w"))
    with pytest.raises(CheckpointError, match="outside the model directory"):
        load_model(model_copy)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(num_pages=0), "num_pages"), (dict(num_pages=-1), "num_pages"), (dict(num_pages=2.5), "num_pages"),
    (dict(num_pages="8"), "num_pages"), (dict(max_model_len=0), "max_model_len"),
    (dict(max_model_len=-5), "max_model_len"), (dict(device="foo"), "device 'foo'"),
    (dict(device="meta"), "runs on 'cpu' or 'cuda'"),
])
def test_engine_options_are_validated(llama_dir, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        LLM(llama_dir, **kwargs)


def test_tree_top_k_is_bounded():
    with pytest.raises(ValueError, match="tree_top_k must be at most 63"):
        SpecConfig(method="eagle_tree", tree_top_k=10 ** 5)


def test_finished_request_statistics_stay_bounded(llama_dir):
    llm = LLM(llama_dir)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate([[1, 2]] * 5, params)
    before = len(json.dumps(vars(llm.engine.finished)))
    llm.generate([[1, 2]] * 50, params)
    assert len(json.dumps(vars(llm.engine.finished))) <= before + 8
    s = llm.stats()
    assert s["num_requests"] == 55 and s["num_output_tokens"] == 110 and s["finish_reasons"] == {"length": 55}


def test_invalid_tokenizer_config_is_a_checkpoint_error(model_copy):
    open(os.path.join(model_copy, "tokenizer_config.json"), "w").write("{broken")
    with pytest.raises(CheckpointError, match="tokenizer_config.json: not valid JSON"):
        LLM(model_copy)
