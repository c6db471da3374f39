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


#: Llama-3.1-70B's arithmetic, from its config (80 layers, hidden 8192, 64 heads, 8 KV heads of
#: 128, MLP 28672, vocab 128256, bf16), worked out here rather than by ``Shape``:
#:   attention a layer  2 * 8192 * 64 * 128 + 2 * 8192 * 8 * 128 = 150,994,944 parameters
#:   MLP a layer        3 * 8192 * 28672                         = 704,643,072
#:   LM head            128256 * 8192                            = 1,050,673,152
#:   a token's matmuls  80 * (150,994,944 + 704,643,072) + 1,050,673,152 = 69,501,714,432
#:                      parameters: 2x that in FLOPs, and 2x that in bytes read once a step
#:   KV a token         80 layers * 2 (K, V) * 8 heads * 128 * 2 bytes = 327,680 bytes
#:   attention FLOPs    80 * 4 * 64 * 128 = 2,621,440 per query token per context token
LLAMA_70B_LAYERS, LLAMA_70B_HIDDEN = 80, 8192
LLAMA_70B_MATMUL_PARAMETERS = 80 * (150_994_944 + 704_643_072) + 1_050_673_152
#: H100: 989.5 dense bf16 TFLOP/s, 3.35 TB/s, 450 GB/s NVLink each way. The efficiencies the
#: test prices at: half the FLOP/s, 80% of the bandwidth, 70% of the link, 10 us an all-reduce.
H100_PEAK, H100_BANDWIDTH, H100_LINK = 989.5e12, 3.35e12, 450e9
PRICED = Efficiency(compute=0.5, memory=0.8, interconnect=0.7, overhead=0.0, per_sequence=0.0,
                    all_reduce_latency=1e-5)  # fmt: skip


def _ring_all_reduces_by_hand(tokens: int, chips: int) -> float:
    """Two all-reduces a layer (attention's output and the MLP's), each of ``tokens`` bf16
    activations of the hidden width. A ring all-reduce sends (and receives) 2 (p - 1) / p of the
    buffer through each chip's link: reduce-scatter then all-gather, p - 1 steps of 1 / p each."""
    if chips == 1:
        return 0.0
    buffer = tokens * LLAMA_70B_HIDDEN * 2  # bytes
    one = 2 * (chips - 1) / chips * buffer / (H100_LINK * 0.7) + 1e-5
    return 2 * LLAMA_70B_LAYERS * one


def _llama_70b_step_by_hand(tokens: int, requests: int, context: int, chips: int) -> float:
    """A forward of ``tokens`` query tokens of ``requests`` sequences over ``context`` context
    tokens in all, the compute and the bytes split over ``chips`` (GQA's KV heads split too)."""
    p = LLAMA_70B_MATMUL_PARAMETERS
    linear = max(2 * p * tokens / (H100_PEAK * 0.5 * chips), 2 * p / (H100_BANDWIDTH * 0.8 * chips))
    attention = max(
        2_621_440 * tokens * (context / requests) / (H100_PEAK * 0.5 * chips),
        327_680 * context / (H100_BANDWIDTH * 0.8 * chips),
    )
    return linear + attention + _ring_all_reduces_by_hand(tokens, chips)


def test_tensor_parallelism_splits_the_reads_and_pays_all_reduces() -> None:
    """Llama-3.1-70B on H100s at TP 1, 2 and 8, against the step worked out by hand above."""
    model, chip = catalog.model("llama-3.1-70b"), catalog.chip("h100")
    assert 2 * 8192 * 64 * 128 + 2 * 8192 * 8 * 128 == 150_994_944
    assert (3 * 8192 * 28672, 128256 * 8192) == (704_643_072, 1_050_673_152)
    assert LLAMA_70B_MATMUL_PARAMETERS == 69_501_714_432
    assert (80 * 2 * 8 * 128 * 2, 80 * 4 * 64 * 128) == (327_680, 2_621_440)
    # A prefill of 4,096 tokens moves 4096 * 8192 * 2 = 67,108,864 bytes an all-reduce; at TP 8
    # the ring sends 2 * 7 / 8 = 1.75x that through each 315 GB/s link: 372.8 us + 10 us, 160
    # times a step: 61.25 ms. At TP 2 the ring factor is 2 * 1 / 2 = 1: 160 * 223.0 us = 35.69 ms.
    assert _ring_all_reduces_by_hand(4096, 8) == pytest.approx(0.0612523, rel=1e-5)
    assert _ring_all_reduces_by_hand(4096, 2) == pytest.approx(0.0356870, rel=1e-5)
    # Decode, batch 8 at 4k each: 139.0 GB of weights at 2.68 TB/s a chip, split over the chips
    # (25.93 ms at TP 2), and the all-reduces pay mostly their latency (160 x 10 us).
    assert _llama_70b_step_by_hand(8, 8, 8 * 4096, 2) == pytest.approx(0.0296033, rel=1e-5)
    # The 4,096-token prefill at TP 8: 143.85 ms of matmuls, 11.11 of attention, 61.25 of wire.
    assert _llama_70b_step_by_hand(4096, 1, 4096, 8) == pytest.approx(0.2162140, rel=1e-5)
    for chips in (1, 2, 8):
        cost = Roofline(model, chip, chips, efficiency=PRICED)
        for tokens, requests, context in ((8, 8, 8 * 4096), (4096, 1, 4096), (1, 1, 100)):
            expected = _llama_70b_step_by_hand(tokens, requests, context, chips)
            got = cost.verify(tokens, requests, context)
            assert got == pytest.approx(expected, rel=1e-9), (chips, tokens, got, expected)


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
