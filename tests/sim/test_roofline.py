"""The catalog and the roofline: the architecture arithmetic against the parameter counts the
model cards publish, reading a Hugging Face ``config.json``, and the physics a step price must
obey (a decode step never beats reading the weights; speculation's gain shrinks as the batch
grows; a MoE step reads more experts as its batch grows; KV capacity is what the weights
leave)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.acceptance import ValidationError, minimum_variance_rates
from speclens.sim import catalog
from speclens.sim.roofline import Efficiency, Roofline, Shape
from speclens.sim.scenario import load_scenario, pool_cost
from speclens.sim.simulate import simulate

#: Parameters the model cards publish (MTP layers not counted), and the tolerance the
#: arithmetic must meet. Llama 3.1 8B: 8.03B and 70B: 70.6B (meta-llama model cards,
#: "Model Information"); Qwen3-32B: 32.8B ("Number of Parameters"); DeepSeek-V3: 671B, 37B
#: activated (its README); SmolLM2-135M: 135M; Kimi K3: 2.8T announced (its card).
PUBLISHED = [
    ("smollm2-135m", 135e6, 0.01),
    ("llama-3.1-8b", 8.03e9, 0.005),
    ("llama-3.1-70b", 70.6e9, 0.005),
    ("qwen3-32b", 32.8e9, 0.005),
    ("deepseek-v3", 671e9, 0.005),
    ("kimi-k3", 2.8e12, 0.03),
]


def test_every_shipped_entry_validates_and_cites_its_source() -> None:
    assert {"smollm2-135m", "llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "deepseek-v3",
            "kimi-k3"} <= set(catalog.names("models"))  # fmt: skip
    assert {"h100", "h200", "b200", "b300", "mi300x", "mi355x"} <= set(catalog.names("chips"))
    for name in catalog.names("models"):
        entry = catalog.model(name)
        assert entry.name == name and entry.source.startswith("https://"), name
    for name in catalog.names("chips"):
        entry = catalog.chip(name)
        assert entry.name == name and entry.source.startswith("https://"), name


@pytest.mark.parametrize(("name", "published", "tolerance"), PUBLISHED)
def test_parameters_match_the_model_card(name: str, published: float, tolerance: float) -> None:
    counted = Shape.of(catalog.model(name)).parameters()
    assert counted == pytest.approx(published, rel=tolerance), f"{counted / 1e9:.3f}B"


def test_deepseek_activates_37b_of_its_671b() -> None:
    shape = Shape.of(catalog.model("deepseek-v3"))
    # Activated parameters: every token's matmuls (the LM head included, the embedding not).
    assert shape.flops_per_token() / 2 == pytest.approx(37e9, rel=0.02)
    # One token reads the shared weights and 8 experts a layer; a big batch reads nearly all.
    assert shape.read_bytes(1) == pytest.approx(shape.flops_per_token() / 2, rel=0.02)  # fp8
    assert shape.read_bytes(1) < shape.read_bytes(8) < shape.read_bytes(64) < shape.read_bytes(4096)
    assert shape.read_bytes(4096) == pytest.approx(shape.weights_bytes(), rel=0.03)


def _hf(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(json.dumps(config))
    return path


def test_a_hugging_face_config_reads_as_the_catalog_entry(tmp_path: Path) -> None:
    llama = _hf(tmp_path / "config.json", {
        "_name_or_path": "meta-llama/Llama-3.1-8B", "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 500000.0,
    })  # fmt: skip
    assert Shape.of(catalog.read_model(llama)) == Shape.of(catalog.model("llama-3.1-8b"))
    # A multimodal wrapper keeps its language model under text_config; FP8 from its quantization.
    deepseek = catalog.model("deepseek-v3")
    nested = _hf(tmp_path / "wrapped.json", {
        "quantization_config": {"quant_method": "fp8"},
        "text_config": {
            "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
            "num_key_value_heads": 128, "intermediate_size": 18432, "vocab_size": 129280,
            "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
            "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "kv_lora_rank": 512,
            "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
            "v_head_dim": 128, "num_nextn_predict_layers": 1,
        },
    })  # fmt: skip
    assert Shape.of(catalog.read_model(nested)) == Shape.of(deepseek)


def test_a_config_missing_a_field_names_it(tmp_path: Path) -> None:
    path = _hf(tmp_path / "config.json", {"num_hidden_layers": 2, "hidden_size": 64})
    with pytest.raises(ValidationError) as caught:
        catalog.read_model(path)
    paths = {p.path for p in caught.value.problems}
    assert {"num_attention_heads", "intermediate_size", "vocab_size"} <= paths, paths


def _scenario(tmp_path: Path, model: str, hardware: str, name: str = "s", **pool: Any) -> Path:
    data = {
        "model": model,
        "hardware": hardware,
        "deployment": {"pools": [{"role": "mixed", **pool}]},
        "workload": {"input_tokens": 128, "output_tokens": 64, "requests": 64},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(path: Path, concurrency: int, rates: list[float] | None = None) -> dict[str, Any]:
    scenario = load_scenario(path)
    requests = max(4 * concurrency, 32)
    workload = scenario.workload.model_copy(update={"requests": requests})
    scenario = scenario.model_copy(update={"workload": workload})
    return simulate(scenario, path.parent, rates, concurrency=concurrency, fast=True)


@pytest.mark.parametrize("ideal", [False, True], ids=["default", "ideal-efficiency"])
def test_batch_one_decode_never_beats_reading_the_weights(tmp_path: Path, ideal: bool) -> None:
    """Llama-3.1-8B on one H100, no speculation: every decode step reads 15 GB of weights at
    3.35 TB/s, so TPOT is at least 4.5 ms, however efficient the engine."""
    pool = {"efficiency": {"compute": 1.0, "memory": 1.0, "overhead": 0.0}} if ideal else {}
    path = _scenario(tmp_path, "llama-3.1-8b", "h100", **pool)
    floor_ms = 1e3 * Shape.of(catalog.model("llama-3.1-8b")).read_bytes(1) / 3.35e12
    assert 4.4 < floor_ms < 4.6
    tpot = _run(path, 1)["latency_ms"]["tpot"]
    assert tpot["p50"] >= floor_ms and tpot["min"] >= floor_ms, (tpot, floor_ms)
    if ideal:  # at batch 1 the weights are nearly all of it
        assert tpot["p50"] == pytest.approx(floor_ms, rel=0.05)


def test_speculation_gains_less_as_the_batch_grows(tmp_path: Path) -> None:
    """EAGLE at K 3 and AL 2.5 on Llama-3.1-8B / H100: at batch 1 a verify step of 4 tokens
    costs about what a 1-token step does (memory-bound), so output throughput rises by most of
    the AL; as the batch grows the step turns compute-bound, each verify slot costs FLOPs, and
    the gain falls (below 1 once rejected drafts waste more than they save)."""
    spec = {"engine": {"speculative": {"method": "eagle", "num_spec_tokens": 3},
                       "max_num_seqs": 512}}  # fmt: skip
    plain_path = _scenario(tmp_path, "llama-3.1-8b", "h100", "plain", engine={"max_num_seqs": 512})
    spec_path = _scenario(tmp_path, "llama-3.1-8b", "h100", "spec", **spec)
    rates = minimum_variance_rates(2.5, 3)
    gains = []
    for concurrency in (1, 16, 128, 512):
        plain = _run(plain_path, concurrency)["throughput"]["output_tokens_per_s"]
        fast = _run(spec_path, concurrency, rates)["throughput"]["output_tokens_per_s"]
        gains.append(fast / plain)
    assert gains[0] > 1.8, gains
    assert all(a > b for a, b in itertools.pairwise(gains)), gains
    assert gains[-1] < 1.0, gains


def test_tensor_parallelism_splits_the_reads_and_pays_all_reduces() -> None:
    model, chip = catalog.model("llama-3.1-70b"), catalog.chip("h100")
    idle = Efficiency(overhead=0.0, per_sequence=0.0)
    one, two = Roofline(model, chip, 1, efficiency=idle), Roofline(model, chip, 2, efficiency=idle)
    assert one._all_reduce(8) == 0.0 and two._all_reduce(8) > 0.0
    assert two.verify(8, 8, 8000) == pytest.approx(one.verify(8, 8, 8000) / 2 + two._all_reduce(8))


def test_kv_capacity_is_what_the_weights_leave(tmp_path: Path) -> None:
    model, chip = catalog.model("llama-3.1-8b"), catalog.chip("h100")
    cost = Roofline(model, chip, 1)
    free = 80e9 * 0.9 - Shape.of(model).weights_bytes()
    assert cost.kv_tokens() == int(free // (32 * 2 * 8 * 128 * 2))
    scenario = load_scenario(_scenario(tmp_path, "llama-3.1-8b", "h100"))
    assert scenario.deployment.pools[0].engine.kv_cache_tokens == cost.kv_tokens()
    stated = load_scenario(_scenario(tmp_path, "llama-3.1-8b", "h100",
                                     engine={"kv_cache_tokens": 5000}))  # fmt: skip
    assert stated.deployment.pools[0].engine.kv_cache_tokens == 5000


def test_weights_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "llama-3.1-70b", "h100")
    with pytest.raises(ValidationError) as caught:
        load_scenario(path)
    (problem,) = caught.value.problems
    assert problem.path == "deployment.pools[0].parallel"
    assert problem.message == (
        "llama-3.1-70b's weights (141.1 GB) do not fit in 1 x 80 GB of h100 at 90% use: "
        "raise parallel"
    )
    assert load_scenario(_scenario(tmp_path, "llama-3.1-70b", "h100", parallel=2))


def test_an_unknown_catalog_name_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        load_scenario(_scenario(tmp_path, "llama-9", "h100"))
    (problem,) = caught.value.problems
    assert problem.path == "model" and problem.message.startswith("'llama-9' is not in the catalog")
    assert "llama-3.1-8b" in problem.message


def test_an_unknown_draft_model_names_its_pool(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "llama-3.1-8b", "h100")
    data = yaml.safe_load(path.read_text())
    draft = {"method": "draft_model", "draft_model": "llama-9", "num_spec_tokens": 3}
    data["deployment"]["pools"].append({"role": "mixed", "engine": {"speculative": draft}})
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValidationError) as caught:
        load_scenario(path)
    (problem,) = caught.value.problems
    assert problem.path == "deployment.pools[1].engine.speculative.draft_model", problem
    assert problem.message.startswith("'llama-9' is not in the catalog")


def test_drafters_are_priced_by_method() -> None:
    model, chip = catalog.model("llama-3.1-8b"), catalog.chip("h100")
    ngram = Roofline(model, chip, method="ngram")
    eagle = Roofline(model, chip, method="eagle")
    two = Roofline(model, chip, method="eagle", draft_layers=2)
    small = Roofline(model, chip, method="draft_model",
                     drafter=Roofline(catalog.model("smollm2-135m"), chip))  # fmt: skip
    assert ngram.draft(4) == 0.0
    assert 0 < small.draft(4) < eagle.draft(4) < two.draft(4) < ngram.verify(4, 4, 0)
    # K drafter forwards join the verify step only when a request drafts.
    assert eagle.decode(4, 1, 100, 1, 3) == pytest.approx(
        eagle.verify(4, 1, 100) + 3 * eagle.draft(1)
    )
    assert eagle.decode(1, 1, 100, 0, 3) == eagle.verify(1, 1, 100)


def test_the_example_is_priced_by_the_catalog() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "kimi-k3-dspark.yaml"
    scenario = load_scenario(example)
    pool = scenario.deployment.pools[0]
    assert pool.step_cost is None and pool.step_cost_file is None
    cost = pool_cost(pool, example.parent, scenario)
    assert isinstance(cost, Roofline)
    assert (cost.model.name, cost.chip.name, cost.parallel) == ("kimi-k3", "b300", 8)


def test_a_run_says_where_each_pool_is_priced_from(tmp_path: Path) -> None:
    """A roofline, a cost file (a calibration's, say), inline prices and the default are four
    different claims: the run names which one priced each pool (it used to call every step cost
    "stated", a fitted file included)."""
    (tmp_path / "cost.yaml").write_text("base: 0.004\nper_seq: 0.001\n")
    pools = [{}, {"step_cost_file": "cost.yaml"}, {"step_cost": {"base": 0.002}}]
    found = []
    for i, pool in enumerate(pools):
        found.append(_run(_scenario(tmp_path, "llama-3.1-8b", "h100", f"p{i}", **pool), 2))
    sources = [r["pricing"]["0"]["source"] for r in found]
    assert sources == ["a roofline", "from cost.yaml", "stated in the scenario"], sources
    assert found[1]["pricing"]["0"]["base"] == 0.004
    path = _scenario(tmp_path, "llama-3.1-8b", "h100", "bare")
    data = yaml.safe_load(path.read_text())
    del data["hardware"]
    path.write_text(yaml.safe_dump(data))
    assert _run(path, 2)["pricing"]["0"]["source"].startswith("the default")
