"""``speclens sim`` on a scenario with a prefill pool and a decode pool: the disaggregated
deployment solved in its steady state. Every expected figure comes from ``speclens.sim.disagg``
called here on pools built by hand from the catalog's entries (never from the scenario path's
own code), and the decision's answer from compare's reading of each curve at the target."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from publishedkit import disagg_point, metrics, write_points
from speclens.sim import catalog, disagg
from speclens.sim import decide as dk
from speclens.sim.catalog import Efficiency
from speclens.sim.closed_loop import Load
from speclens.sim.roofline import Roofline
from speclens.sim.run_output import run_trust
from speclens.sim.scenario import Workload, load_scenario
from speclens.sim.simulate import arrivals

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dsr1-gb200-disagg.yaml"
AL = 2.438  # the example's stated AL at K 3


def _example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return data


def _write(tmp_path: Path, data: dict[str, Any], name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _pools(
    prefill_workers: int = 2,
    decode_workers: int = 1,
    method: str | None = "mtp",
    efficiency: Efficiency | None = None,
) -> disagg.Pools:
    """The example's pools, by hand: DeepSeek-R1 with FP4 experts on GB200; a prefill worker
    of TP 4, EP 4, DP attention, no drafter, at its own compute efficiency where one is stated;
    a decode worker of TP 8, EP 8 with ``method``; the chip's efficiencies unless given."""
    model = catalog.with_precision(catalog.model("deepseek-r1"), "fp4")
    chip = catalog.chip("gb200")
    e = efficiency or chip.efficiency or Efficiency()
    first = e if e.prefill_compute is None else e.model_copy(update={"compute": e.prefill_compute})
    prefill = Roofline(model, chip, 4, efficiency=first, expert_parallel=4, dp_attention=True)
    decode = Roofline(model, chip, 8, method=method, efficiency=e, expert_parallel=8)
    return disagg.Pools(prefill, decode, prefill_workers, decode_workers)


def _ms(figures: disagg.Figures) -> dict[str, Any]:
    return figures.summary_figures()


def _sim(run_cli: Any, *args: Any) -> Any:
    code, out, err = run_cli("sim", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_example_is_disagg_figures_on_its_pools_and_load(run_cli: Any) -> None:
    """The example (640 requests of 8192 in / 1024 out, closed at 64, K 3 at AL 2.438): its
    figures are ``disagg.figures`` on the pools built by hand, the load at the decode pool's K
    and AL, and the prefill pool's step budget (its engine's: max_model_len 32768)."""
    got = _sim(run_cli, EXAMPLE)
    load = Load(64, 8192, 1024, num_spec_tokens=3, acceptance_length=AL, budget=32768,
                requests=640)  # fmt: skip
    lengths = (np.full(640, 8192), np.full(640, 1024))
    want = _ms(disagg.figures(load, _pools(), drawn=lengths))
    assert got["latency_ms"] == want["latency_ms"]
    for key, value in want["throughput"].items():
        assert got["throughput"][key] == pytest.approx(value, rel=1e-12)
    state = disagg.steady(load, _pools(), 0.0, *lengths)
    assert got["steady"] == pytest.approx(disagg.describe(state)) and state.bound == "decode"
    assert got["resolution"]["layer"] == "workload" and "InferenceX" in got["resolution"]["source"]
    assert got["trust"] == run_trust(load_scenario(EXAMPLE), EXAMPLE.parent, 3)


def test_drawn_lengths_and_the_budget_are_the_scenarios(run_cli: Any, tmp_path: Path) -> None:
    """Uniform lengths drawn as ``simulate.arrivals`` draws them at the seed, and a prefill
    pool whose engine takes 16,384 tokens a step at a compute efficiency of its own (0.25): the
    figures are ``disagg.figures`` on exactly those lengths, that budget and that efficiency,
    and another seed draws other lengths."""
    data = _example()
    data["workload"] |= {"input_tokens": {"min": 2048, "max": 8192},
                         "output_tokens": {"min": 256, "max": 1024}, "requests": 300}  # fmt: skip
    data["deployment"]["pools"][0]["engine"] = {"max_model_len": 16384}
    data["deployment"]["pools"][0]["efficiency"] = {"prefill_compute": 0.25}
    path = _write(tmp_path, data)
    chip = catalog.chip("gb200").efficiency or Efficiency()
    stated = chip.model_copy(update={"prefill_compute": 0.25})
    pools = _pools(efficiency=stated)
    pools = disagg.Pools(pools.prefill, _pools().decode, 2, 1)  # the decode pool states none
    workload = Workload.model_validate(data["workload"])
    runs = {}
    for seed in (3, 4):
        got = _sim(run_cli, path, "--seed", seed)
        drawn = list(arrivals(workload, seed))
        lengths = (np.array([r.input_tokens for r in drawn]),
                   np.array([r.output_tokens for r in drawn]))  # fmt: skip
        load = Load(64, 8192, 1024, num_spec_tokens=3, acceptance_length=AL, budget=16384,
                    requests=300)  # fmt: skip
        want = _ms(disagg.figures(load, pools, drawn=lengths))
        assert got["latency_ms"] == want["latency_ms"]
        assert got["throughput"]["output_tokens_per_s"] == pytest.approx(
            want["throughput"]["output_tokens_per_s"], rel=1e-12)  # fmt: skip
        runs[seed] = got["latency_ms"]["tpot"]["p50"]
    assert runs[3] != runs[4]


def test_throughput_per_gpu_counts_both_pools(run_cli: Any, tmp_path: Path) -> None:
    """2 prefill workers of 4 GPUs and 1 decode worker of 8: 16 GPUs; 3 prefill workers
    (spelt ``replicas``): 20, the decode pool's figures per GPU falling with them."""
    got = _sim(run_cli, EXAMPLE)
    tput = got["throughput"]
    assert got["gpus"] == 16
    assert tput["output_tokens_per_s_per_gpu"] == pytest.approx(tput["output_tokens_per_s"] / 16)
    assert tput["total_tokens_per_s_per_gpu"] == pytest.approx(tput["total_tokens_per_s"] / 16)
    data = _example()
    del data["deployment"]["pools"][0]["workers"]
    data["deployment"]["pools"][0]["replicas"] = 3
    more = _sim(run_cli, _write(tmp_path, data))
    assert more["gpus"] == 20
    out = more["throughput"]
    assert out["output_tokens_per_s_per_gpu"] == pytest.approx(out["output_tokens_per_s"] / 20)


def test_the_decode_pools_k_and_al_are_used_and_the_prefill_pool_never_drafts(
    run_cli: Any, tmp_path: Path
) -> None:  # fmt: skip
    """The decode pool speculates at its K and the AL resolved for it (the command line's
    here); the prefill pool prices no drafter (its KV bytes a token, and so the transfer,
    are the model's alone). K 0 in a sweep is the decode pool without speculation."""
    got = _sim(run_cli, EXAMPLE, "--acceptance-length", "3.1")
    pricing = got["pricing"]
    assert pricing["prefill"]["method"] is None and pricing["decode"]["method"] == "mtp"
    assert got["acceptance_length"] == 3.1 and got["num_spec_tokens"] == 3
    lengths = (np.full(640, 8192), np.full(640, 1024))
    at = Load(64, 8192, 1024, num_spec_tokens=3, acceptance_length=3.1, budget=32768,
              requests=640)  # fmt: skip
    want = _ms(disagg.figures(at, _pools(), drawn=lengths))
    assert got["latency_ms"] == want["latency_ms"]
    # a drafting prefill worker would carry the MTP layer's KV too: a slower transfer
    drafting = disagg.Pools(_pools().decode, _pools().decode, 2, 1)
    assert drafting.prefill.kv_bytes_per_token() > _pools().prefill.kv_bytes_per_token()
    data = _example()
    del data["workload"]["acceptance"]
    path = _write(tmp_path, data)
    sweep = _sim(run_cli, path, "--acceptance-rate", "0.5", "--sweep", "num_spec_tokens=0,2")
    k0, k2 = sweep
    assert (k0["num_spec_tokens"], k0["acceptance_length"], k0["resolution"]) == (0, 1.0, None)
    assert k0["pricing"]["decode"]["method"] is None
    plain = Load(64, 8192, 1024, budget=32768, requests=640)
    want0 = _ms(disagg.figures(plain, _pools(method=None), drawn=lengths))
    assert k0["latency_ms"] == want0["latency_ms"]
    assert k2["acceptance_length"] == pytest.approx(2.0)
    two = Load(64, 8192, 1024, num_spec_tokens=2, acceptance_length=2.0, budget=32768,
               requests=640)  # fmt: skip
    want2 = _ms(disagg.figures(two, _pools(), drawn=lengths))
    assert k2["latency_ms"] == want2["latency_ms"]


def test_an_open_loop_runs_at_the_workloads_rate(run_cli: Any, tmp_path: Path) -> None:
    data = _example()
    data["workload"].pop("concurrency")
    data["workload"]["rate"] = 4.0
    got = _sim(run_cli, _write(tmp_path, data))
    load = Load(1, 8192, 1024, num_spec_tokens=3, acceptance_length=AL, budget=32768,
                requests=640)  # fmt: skip
    lengths = (np.full(640, 8192), np.full(640, 1024))
    want = _ms(disagg.figures(load, _pools(), rate=4.0, drawn=lengths))
    assert got["latency_ms"] == want["latency_ms"]
    assert got["throughput"]["requests_per_s"] == pytest.approx(4.0)
    assert (got["concurrency"], got["request_rate"]) == (None, 4.0)


CONCURRENCIES = (16, 64, 256)


def _curve(workers: int, target: float) -> tuple[float | None, list[str]]:
    """The split with ``workers`` prefill workers at ``target`` tok/s/user, by hand: each
    concurrency's figures from ``disagg.figures``, output tok/s/GPU over both pools' GPUs
    against 1000 / mean TPOT, read on the Pareto curve at the target (compare's reading)."""
    points, bounds = [], []
    pools = _pools(prefill_workers=workers, efficiency=Efficiency())
    lengths = (np.full(640, 8192), np.full(640, 1024))
    for c in CONCURRENCIES:
        load = Load(c, 8192, 1024, num_spec_tokens=3, acceptance_length=AL, budget=32768,
                    requests=640)  # fmt: skip
        figures = disagg.figures(load, pools, drawn=lengths)
        tpot_ms = 1e3 * float(np.mean(figures.tpot_s))
        per_gpu = figures.output_tokens / figures.duration_s / pools.gpus
        points.append((1000.0 / tpot_ms, per_gpu))
        bounds.append(disagg.steady(load, pools, 0.0, *lengths).bound)
    return dk.at(dk.pareto(points), target), bounds


#: The roofline's global efficiencies stated on both pools (the chip's defaults may change).
PINNED = {**Efficiency().model_dump(), "prefill_compute": None}


def test_the_decision_names_the_split_with_the_most_per_gpu(
    run_cli: Any, tmp_path: Path
) -> None:  # fmt: skip
    """Prefill workers 1..3 at 100 tok/s/user: one prefill worker starves the decode worker
    (the prefill pool bounds it at the highest concurrency, so its decode batch, and its
    curve, never reach down to 100 tok/s/user); of the others, two prefill workers deliver the
    most output tok/s/GPU: a third adds GPUs, not throughput."""
    target = 100.0
    by_hand = {w: _curve(w, target) for w in (1, 2, 3)}
    assert by_hand[1][0] is None and by_hand[1][1][-1] == "prefill"
    best = max((w for w in by_hand if by_hand[w][0] is not None), key=lambda w: by_hand[w][0])
    assert best == 2
    data = _example()
    for pool in data["deployment"]["pools"]:
        pool["efficiency"] = PINNED
    path = _write(tmp_path, data)
    got = _sim(run_cli, path, "--sweep", "deployment.pools[0].workers=1..3", "--sweep",
               "concurrency=" + ",".join(map(str, CONCURRENCIES)), "--at-interactivity",
               target)  # fmt: skip
    decision = got["decision"]
    assert len(got["points"]) == 9
    entries = {e["layout"]["prefill"]["workers"]: e for e in decision["configurations"]}
    assert decision["best"] == "p2xtp4-ep4-dpa-d1xtp8-ep8-k3"
    for w, (value, _) in by_hand.items():
        if value is None:
            assert entries[w]["tok_s_gpu"] is None and "not 100" in entries[w]["reason"]
        else:
            assert entries[w]["tok_s_gpu"] == pytest.approx(value, rel=1e-9)
            assert entries[w]["ratio_to_best"] == pytest.approx(value / by_hand[2][0], rel=1e-9)
    assert decision["headline"].startswith(
        "at 100 tok/s/user, prefill 2 x TP 4 (EP 4, DP attention) : decode 1 x TP 8 (EP 8) at "
        "K 3 delivers ")  # fmt: skip
    speculative = ("--speculative-algorithm EAGLE --speculative-num-steps 3 "
                   "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4")  # fmt: skip
    assert decision["flags"] == [
        "prefill: 2 workers, each: --disaggregation-mode prefill --tp-size 4 --ep-size 4 "
        "--enable-dp-attention --dp-size 4",
        f"decode: 1 worker, each: --disaggregation-mode decode --tp-size 8 --ep-size 8 "
        f"{speculative}",
    ]
    for line in decision["flags"]:
        assert shlex.split(line.split(": ", 1)[1].split("each: ")[1])[0] == "--disaggregation-mode"


def test_the_sweep_runs_a_grid_over_both_pools_and_k(run_cli: Any, tmp_path: Path) -> None:
    """Prefill workers x decode width x K x concurrency: each point at its own layout (its
    GPUs, its pricing), printed with the decision first."""
    data = _example()
    del data["workload"]["acceptance"]
    path = _write(tmp_path, data)
    grid = ["--sweep", "deployment.pools[0].workers=1,2", "--sweep",
            "deployment.pools[1].parallel=8,16", "--sweep", "num_spec_tokens=0,3", "--sweep",
            "concurrency=16,64"]  # fmt: skip
    got = _sim(run_cli, path, "--acceptance-rate", "0.5", *grid)
    assert len(got) == 16
    for row in got:
        sweep = row["sweep"]
        p, d = sweep["deployment.pools[0].replicas"], sweep["deployment.pools[1].parallel"]
        assert row["gpus"] == 4 * p + d
        assert row["layout"]["decode"]["tensor_parallel"] == d
        assert row["pricing"]["decode"]["parallel"] == d
    code, out, err = run_cli("sim", path, "--acceptance-rate", "0.5", *grid,
                             "--at-interactivity", "100")  # fmt: skip
    assert code == 0, err
    assert out.startswith("at 100 tok/s/user, prefill ")
    assert "sglang prefill: " in out and "sglang decode: " in out


def test_the_run_directory_compares_with_a_published_point(run_cli: Any, tmp_path: Path) -> None:
    """An InferenceX disaggregated point of the example's deployment (TensorRT-LLM: MTP at K 3)
    imported, and the example's prediction written with --output-dir: compare sets them side
    by side, every deployment field checked and agreeing, and the pools recorded under the
    published names."""
    point = disagg_point(
        hardware="gb200", precision="fp4", framework="trt", prefill_tp=4, prefill_ep=4,
        prefill_dp_attention=True, prefill_num_workers=2, num_prefill_gpu=8, decode_tp=8,
        decode_ep=8, decode_dp_attention=False, decode_num_workers=1, num_decode_gpu=8,
        conc=64, isl=8192, osl=1024, spec_method="mtp",
        metrics=metrics(tpot_s=0.008, conc=64, osl=1024),
    )  # fmt: skip
    published = tmp_path / "published"
    code, _, err = run_cli("import", "inferencex", write_points(tmp_path / "p.json", [point]),
                           "--output-dir", published)  # fmt: skip
    assert code == 0, err
    (config,) = published.iterdir()
    measured = config / "points" / "c64"
    predicted = tmp_path / "predicted"
    code, _, err = run_cli("sim", EXAMPLE, "--output-dir", predicted)
    assert code == 0, err
    ours = json.loads((predicted / "summary.json").read_text())
    theirs = json.loads((measured / "summary.json").read_text())
    for key in ("prefill", "decode"):
        assert ours["settings"][key] == theirs["settings"][key]
    assert ours["settings"]["disaggregated"] is True and ours["settings"]["gpus"] == 16
    code, out, err = run_cli("compare", measured, predicted, "--json")
    assert code == 0, err
    pair = json.loads(out)["pairs"][0]
    checks = {c["name"]: c for c in pair["checks"]}
    assert checks["deployment"]["ok"] is True, checks["deployment"]
    assert "disaggregated true" in checks["deployment"]["detail"]
    assert checks["k"]["ok"] is True and checks["load"]["ok"] is True
    tpot = next(d for d in pair["deltas"]["matched_concurrency"] if d["figure"] == "tpot_p50_ms")
    assert tpot["b"]["mean"] == pytest.approx(ours["figures"]["latency_ms"]["tpot"]["p50"])


def test_a_sweep_writes_one_published_sweep_a_configuration(
    run_cli: Any, tmp_path: Path
) -> None:  # fmt: skip
    out = tmp_path / "out"
    code, _, err = run_cli("sim", EXAMPLE, "--sweep", "deployment.pools[0].workers=1,2",
                           "--sweep", "concurrency=16,64", "--at-interactivity", "150",
                           "--output-dir", out)  # fmt: skip
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "decision.json",
        "p1xtp4-ep4-dpa-d1xtp8-ep8-k3",
        "p2xtp4-ep4-dpa-d1xtp8-ep8-k3",
    ]
    for workers in (1, 2):
        root = out / f"p{workers}xtp4-ep4-dpa-d1xtp8-ep8-k3"
        assert sorted(p.name for p in (root / "points").iterdir()) == ["c16", "c64"]
        summary = json.loads((root / "points" / "c64" / "summary.json").read_text())
        assert summary["settings"]["prefill"]["workers"] == workers
        assert summary["aggregate_only"] is True
    decision = json.loads((out / "decision.json").read_text())
    assert decision["tok_s_user"] == 150


def test_the_example_scenario_is_valid_as_shipped() -> None:
    """The example states what the issue names: FP4 DeepSeek-R1 on GB200, prefill 2 x TP 4
    EP 4 DP attention, decode 1 x TP 8 EP 8, MTP K 3 with a cited inline AL."""
    scenario = load_scenario(EXAMPLE)
    prefill, decode = scenario.deployment.pools
    assert (prefill.role, prefill.replicas, prefill.parallel, prefill.expert_parallel,
            prefill.dp_attention) == ("prefill", 2, 4, 4, True)  # fmt: skip
    assert (decode.role, decode.replicas, decode.parallel, decode.expert_parallel,
            decode.dp_attention) == ("decode", 1, 8, 8, False)  # fmt: skip
    assert decode.engine.speculative is not None
    assert decode.engine.speculative.num_spec_tokens == 3
    value = scenario.workload.acceptance
    assert value is not None and value.acceptance_length == AL and value.source
    assert (scenario.model, scenario.hardware, scenario.precision) == ("deepseek-r1", "gb200",
                                                                      "fp4")  # fmt: skip
    assert _example()["deployment"]["pools"][0]["workers"] == 2  # the published spelling


def test_the_steady_state_says_its_tails_rest_on_the_mean_al(run_cli: Any, tmp_path: Path) -> None:
    """The steady state prices the mean AL alone: without a spread it says tails are
    minimum-variance; with one stated it names it and says it was left out."""
    from speclens.acceptance.spread import SPREAD_UNKNOWN

    assert _sim(run_cli, EXAMPLE)["spread"] == {"simulated": False, "line": SPREAD_UNKNOWN}
    data = _example()
    levels = ("p0", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p100")
    quantiles = [1.5, 1.8, 1.9, 2.2, 2.45, 2.7, 3.0, 3.2, 3.6]  # implied mean 2.4525
    data["workload"]["acceptance"]["spread"] = {
        "num_spec_tokens": 3, "quantiles": dict(zip(levels, quantiles, strict=True)),
        "requests": 40,
    }  # fmt: skip
    path = _write(tmp_path, data)
    got = _sim(run_cli, path)["spread"]
    assert got["simulated"] is False and got["line"].startswith("spread: stated (p10 1.90")
    assert "not simulated" in got["line"]
    code, out, _ = run_cli("sim", path)
    assert code == 0 and "not simulated: the steady state prices the mean AL" in out
