"""The execution policy's counts: which path each forward took."""
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.runtime.execution import PATHS


def test_float32_cpu_steps_run_as_the_native_stack():
    llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=2))
    llm.generate(["def f(x):", "import os"], SamplingParams(max_tokens=12, temperature=0.0))
    counts = llm.stats()["execution"]
    assert set(counts) == {"target", "drafter"} and set(counts["target"]) == set(PATHS)
    assert counts["target"]["native_stack"] >= 12 // 3 and counts["drafter"]["native_stack"] > 0
    assert counts["target"]["torch_ops"] == counts["target"]["cuda_graph"] == 0


def test_16_bit_activations_run_op_by_op_on_torch(caplog):
    with caplog.at_level("WARNING", logger="sonarspec"):
        LLM("default")
    assert not caplog.records
    with caplog.at_level("WARNING", logger="sonarspec"):
        llm = LLM("default", dtype="bfloat16")
    assert any("dtype bfloat16 on the CPU runs the model op by op" in r.getMessage() for r in caplog.records)
    llm.generate(["def f(x):"], SamplingParams(max_tokens=4, temperature=0.0))
    counts = llm.stats()["execution"]["target"]
    assert counts["torch_ops"] == 4 and counts["native_stack"] == 0   # a prefill and three decodes
