"""Published results as aggregate-only runs (``runs.published``, ``runs.published_read``): the
InferenceX reader, its checks, dedupe, ``--where``, the K table, GPUs and totals, configuration
names, the vLLM reader, and the writer's all-or-nothing directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from publishedkit import disagg_point, metrics, point, vllm_result, write_points, write_vllm
from speclens.runs import points as run_points
from speclens.runs import published
from speclens.runs import published_read as pr
from speclens.runs.rundir import InputError


def read(tmp_path: Path, *points: dict, name: str = "b.json") -> list[pr.Published]:
    return pr.read_inferencex(write_points(tmp_path / name, list(points)))


# ------------------------------------------------------------------------------ reading
def test_every_point_is_read_with_its_file_and_index(tmp_path):
    got = read(tmp_path, point(conc=4), point(conc=8))
    assert [(Path(p.file).name, p.index, p.data["conc"]) for p in got] == [("b.json", 0, 4), ("b.json", 1, 8)]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field", "expected"),
    [
        ({"conc": 0}, "[1].conc", "an integer >= 1"),
        ({"conc": 4.0}, "[1].conc", "an integer >= 1"),
        ({"isl": 0}, "[1].isl", "an integer >= 1"),
        ({"hardware": "../x"}, "[1].hardware", "a name"),
        ({"date": "2026-5-1"}, "[1].date", "a date YYYY-MM-DD"),
        ({"disagg": "no"}, "[1].disagg", "true or false"),
        ({"metrics": []}, "[1].metrics", "the published metrics"),
    ],
)
def test_a_bad_point_is_named_by_file_index_and_field(tmp_path, change, field, expected):
    path = write_points(tmp_path / "b.json", [point(), point(**change)])
    with pytest.raises(InputError) as caught:
        pr.read_inferencex(path)
    (line,) = caught.value.lines
    assert line.startswith(f"{path}: {field}: expected {expected}")
    assert caught.value.code == 1


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("median_tpot", 0.0, "seconds > 0"),
        ("median_tpot", -0.01, "seconds > 0"),
        ("p99_ttft", -1.0, "null or seconds >= 0"),
        ("mean_e2el", float("inf"), "null or seconds >= 0"),
        ("tput_per_gpu", -5.0, "tokens/s per GPU >= 0"),
        ("output_tput_per_gpu", "12", "null or a number >= 0"),
    ],
)
def test_a_bad_metric_is_named(tmp_path, key, value, expected):
    path = write_points(tmp_path / "b.json", [point(metrics=metrics() | {key: value})], nan=True)
    with pytest.raises(InputError) as caught:
        pr.read_inferencex(path)
    assert caught.value.lines == [f"{path}: [0].metrics.{key}: expected {expected}, got {value!r}"]


def test_a_missing_median_tpot_is_named(tmp_path):
    m = metrics()
    del m["median_tpot"]
    path = write_points(tmp_path / "b.json", [point(metrics=m)])
    with pytest.raises(InputError, match=r"\[0\]\.metrics\.median_tpot: expected seconds > 0, got nothing"):  # fmt: skip
        pr.read_inferencex(path)


def test_the_point_count_is_bounded_before_the_next_point_is_decoded(tmp_path):
    text = "[" + ",".join(json.dumps(point(conc=c)) for c in (1, 2)) + ", {not json at all"
    seen = []
    with pytest.raises(InputError) as caught:
        for index, _ in pr.iter_list(tmp_path / "f.json", text, limit=2):
            seen.append(index)
    assert seen == [0, 1]
    assert caught.value.lines == [f"{tmp_path / 'f.json'}: more than 2 points: expected at most 2"]


def test_a_list_is_read_to_its_end_and_nothing_after(tmp_path):
    assert list(pr.iter_list(tmp_path / "f", " [ ] ")) == []
    assert [v for _, v in pr.iter_list(tmp_path / "f", "[1, 2]")] == [1, 2]
    with pytest.raises(InputError, match="extra data after the list"):
        list(pr.iter_list(tmp_path / "f", "[1] 2"))
    with pytest.raises(InputError, match="expected a JSON list of points"):
        list(pr.iter_list(tmp_path / "f", '{"a": 1}'))


# ---------------------------------------------------------------------------- summaries
def test_the_summary_states_the_published_point_in_bench_units(tmp_path):
    m = metrics(tpot_s=0.012, conc=16)
    (p,) = read(tmp_path, point(conc=16, metrics=m))
    s = pr.inferencex_summary(p)
    assert published.is_aggregate_only(s) and s["figures"]["aggregate_only"] is True
    st = s["settings"]
    assert st["model"] == "deepseek-r1"
    assert (st["hardware"], st["engine"], st["precision"], st["gpus"]) == (
        "mi355x",
        "sglang",
        "fp8",
        8,
    )
    assert st["input_tokens"] == {"min": 1024, "max": 1024} and st["max_tokens"] == 1024
    assert (st["concurrency"], st["method"], st["num_spec_tokens"]) == (16, None, None)
    assert s["server"]["version"] == "v0.5.12-rocm700-mi35x"
    assert s["provenance"]["run_url"].endswith("/runs/1/attempts/1")
    assert s["provenance"]["index"] == 0 and s["provenance"]["source"] == "inferencex"
    tpot = s["figures"]["latency_ms"]["tpot"]
    assert tpot["p50"] == pytest.approx(12.0) and tpot["p99"] == pytest.approx(18.0)
    assert tpot["mean"] == pytest.approx(12.6) and tpot["p90"] == pytest.approx(15.6)
    assert s["figures"]["latency_ms"]["e2e"]["p50"] == pytest.approx(1000 * m["median_e2el"])
    assert s["figures"]["interactivity"]["p50"] == pytest.approx(1 / 0.012)


def test_totals_are_per_gpu_times_the_gpus(tmp_path):
    (p,) = read(tmp_path, point(decode_tp=4, prefill_tp=4, num_decode_gpu=4))
    t = pr.inferencex_summary(p)["figures"]["throughput"]
    m = p.data["metrics"]
    assert t["output_tokens_per_s_per_gpu"] == m["output_tput_per_gpu"]
    assert t["output_tokens_per_s"] == pytest.approx(4 * m["output_tput_per_gpu"])
    assert t["total_tokens_per_s"] == pytest.approx(4 * m["tput_per_gpu"])


def test_a_history_point_without_means_or_p90_states_none(tmp_path):
    (p,) = read(tmp_path, point(metrics=metrics(full=False)))
    s = pr.inferencex_summary(p)
    assert s["figures"]["latency_ms"]["ttft"] == {
        "mean": None,
        "p50": 100.0,
        "p99": pytest.approx(150.0),
    }
    assert s["figures"]["interactivity"]["mean"] is None
    assert s["settings"]["image"] == "lmsysorg/sglang:v0.5.12-rocm700-mi35x"


@pytest.mark.parametrize(
    ("framework", "hardware", "dpa", "k"),
    [
        ("sglang", "h200", False, 2), ("sglang", "b200", False, 2), ("sglang", "b300", False, 2),
        ("sglang", "mi325x", False, 3), ("sglang", "mi355x", False, 3),
        ("sglang", "mi300x", False, None), ("atom", "mi355x", False, 3),
        ("trt", "h200", False, 3), ("trt", "b200", True, 1),
        ("dynamo-sglang", "gb200", False, None), ("mori-sglang", "mi355x", False, None),
    ],
)  # fmt: skip
def test_k_is_the_readme_table(framework, hardware, dpa, k):
    p = point(framework=framework, hardware=hardware, decode_dp_attention=dpa, spec_method="mtp")
    assert pr.num_spec_tokens(p) == k
    assert pr.num_spec_tokens(p | {"spec_method": "none"}) is None


def test_single_node_gpus_are_decode_tp_not_the_published_tp_times_ep():
    assert pr.gpus(point(decode_ep=8, num_decode_gpu=64, num_prefill_gpu=64)) == 8


def test_disaggregated_gpus_are_prefill_plus_decode(tmp_path):
    (p,) = read(tmp_path, disagg_point())
    assert pr.gpus(p.data) == 24
    s = pr.inferencex_summary(p)
    assert s["settings"]["disaggregated"] is True
    assert s["settings"]["prefill"]["gpus"] == 16 and s["settings"]["decode"]["gpus"] == 8
    t = s["figures"]["throughput"]
    assert t["total_tokens_per_s"] == pytest.approx(24 * p.data["metrics"]["tput_per_gpu"])


def test_configuration_names():
    assert pr.configuration_name(point()) == "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27"
    assert (pr.configuration_name(point(framework="trt", hardware="b200", decode_ep=8,
                                        decode_dp_attention=True, spec_method="mtp", isl=8192))
            == "dsr1-b200-trt-fp8-8192x1024-tp8-ep8-dpa-mtp-2026-05-27")  # fmt: skip
    assert (pr.configuration_name(disagg_point())
            == "dsr1-mi355x-mori-sglang-fp8-8192x1024-p2xtp8-d1xtp8-ep8-dpa-nomtp-2026-05-27")  # fmt: skip


def test_configurations_group_points_and_sort_them_by_concurrency(tmp_path):
    pts = read(tmp_path, point(conc=64), point(conc=4), point(conc=8, spec_method="mtp"), point(conc=16))  # fmt: skip
    groups = pr.configurations(pts)
    assert {k: [s["settings"]["concurrency"] for s in v] for k, v in groups.items()} == {
        "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-27": [8],
        "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27": [4, 16, 64],
    }


def test_two_runs_of_one_configuration_at_one_concurrency_are_refused(tmp_path):
    pts = read(tmp_path, point(), point(run_url="https://example.com/other"))
    with pytest.raises(
        InputError, match=r"\[1\]: configuration .* at concurrency 4 is also .* \[0\]"
    ):
        pr.configurations(pts)


# ------------------------------------------------------------------------------- dedupe
def test_copies_of_one_point_are_merged(tmp_path):
    latest = point(metrics=metrics())
    history = point(metrics=metrics(full=False))
    del history["image"]
    pts = read(tmp_path, history, name="h.json") + read(tmp_path, latest, point(conc=8), name="l.json")  # fmt: skip
    kept, merged = pr.dedupe(pts)
    assert merged == 1 and [p.data["conc"] for p in kept] == [4, 8]
    assert kept[0].data["image"] == latest["image"]
    assert kept[0].data["metrics"] == latest["metrics"]  # the union: the history copy is a subset
    assert Path(kept[0].file).name == "h.json"


def test_copies_that_disagree_are_refused(tmp_path):
    a = read(tmp_path, point(), name="a.json")
    b = read(tmp_path, point(metrics=metrics() | {"median_tpot": 0.02}), name="b.json")
    with pytest.raises(InputError) as caught:
        pr.dedupe(a + b)
    assert "b.json: [0].metrics.median_tpot: expected 0.01 as the same point in" in caught.value.lines[0]  # fmt: skip


# ------------------------------------------------------------------------------- --where
def test_where_compares_published_values_as_text(tmp_path):
    pts = read(tmp_path, point(conc=4), point(conc=8), point(conc=8, hardware="h200"),
               point(conc=16, spec_method="mtp"))  # fmt: skip

    def conc(where):
        return [p.data["conc"] for p in pr.select(pts, pr.parse_where(where))]

    assert conc(["hardware=mi355x"]) == [4, 8, 16]
    assert conc(["conc=8"]) == [8, 8]
    assert conc(["conc=8", "hardware=mi355x"]) == [8]
    assert conc(["conc=4", "conc=16"]) == [4, 16]  # one key's values are alternatives
    assert conc(["disagg=false", "spec_method=none", "date=2026-05-27"]) == [4, 8, 8]
    assert conc(["decode_dp_attention=true"]) == []


def test_where_refuses_an_unknown_key_naming_the_known_ones(tmp_path):
    pts = read(tmp_path, point())
    with pytest.raises(InputError) as caught:
        pr.select(pts, pr.parse_where(["chip=mi355x"]))
    assert caught.value.code == 2
    assert caught.value.lines[0].startswith("command line: --where: unknown key 'chip': expected one of hardware, framework")  # fmt: skip
    with pytest.raises(InputError, match="expected KEY=VALUE") as usage:
        pr.parse_where(["hardware"])
    assert usage.value.code == 2


# ----------------------------------------------------------------------------- vLLM file
def test_a_vllm_result_becomes_a_summary(tmp_path):
    s = pr.vllm_summary(write_vllm(tmp_path / "v.json", vllm_result()))
    assert published.is_aggregate_only(s)
    st = s["settings"]
    assert (st["model"], st["concurrency"], st["request_rate"], st["num_requests"]) == ("smollm2", 2, None, 8)  # fmt: skip
    assert (st["gpus"], st["hardware"], st["date"], st["method"]) == (
        None,
        None,
        "2026-12-04",
        None,
    )
    lat = s["figures"]["latency_ms"]
    assert lat["tpot"] == {"mean": 52.0, "p50": 51.0, "p90": None, "p99": 60.0}
    assert "e2e" not in lat  # vLLM reports E2EL only when --percentile-metrics asks for it
    t = s["figures"]["throughput"]
    assert (t["output_tokens_per_s"], t["total_tokens_per_s"], t["requests_per_s"]) == (32.0, 96.0, 2.0)  # fmt: skip
    assert t["output_tokens_per_s_per_gpu"] is None and t["total_tokens_per_s_per_gpu"] is None
    assert s["figures"]["acceptance"] is None


def test_a_vllm_result_with_gpus_rate_and_speculation(tmp_path):
    result = vllm_result(request_rate=4.0, max_concurrency=None, spec_decode_acceptance_length=2.5,
                         spec_decode_acceptance_rate=37.5, spec_decode_num_drafts=100,
                         spec_decode_draft_tokens=400, spec_decode_accepted_tokens=150,
                         spec_decode_per_position_acceptance_rates=[0.6, 0.4, 0.3, 0.2])  # fmt: skip
    s = pr.vllm_summary(write_vllm(tmp_path / "v.json", result), gpus=2, hardware="h100")
    assert (s["settings"]["request_rate"], s["settings"]["concurrency"]) == (4.0, None)
    assert (s["settings"]["gpus"], s["settings"]["hardware"], s["settings"]["num_spec_tokens"]) == (2, "h100", 4)  # fmt: skip
    assert s["figures"]["throughput"]["output_tokens_per_s_per_gpu"] == 16.0
    assert s["figures"]["throughput"]["total_tokens_per_s_per_gpu"] == 48.0
    acc = s["figures"]["acceptance"]
    assert (acc["acceptance_length"], acc["num_spec_tokens"], acc["acceptance_rate"]) == (
        2.5,
        4,
        0.375,
    )


def test_a_vllm_results_k_is_its_positions_not_tokens_over_drafts(tmp_path):
    """An n-gram drafter proposes fewer than K tokens: 300 draft tokens over 100 drafts is not
    K 3 when nothing says so; without per-position rates K is unknown."""
    result = vllm_result(spec_decode_acceptance_length=2.0, spec_decode_num_drafts=100,
                         spec_decode_draft_tokens=300, spec_decode_accepted_tokens=100)  # fmt: skip
    s = pr.vllm_summary(write_vllm(tmp_path / "v.json", result))
    assert s["settings"]["num_spec_tokens"] is None
    assert s["figures"]["acceptance"]["num_spec_tokens"] is None


# ------------------------------------------------------------------------------- writing
def summaries(tmp_path: Path, *concs: int) -> list[dict]:
    return [pr.inferencex_summary(p) for p in read(tmp_path, *(point(conc=c) for c in concs))]


def test_a_sweep_is_written_as_the_sweep_readers_read_it(tmp_path):
    out = tmp_path / "out" / "cfg"
    published.write_sweep(out, summaries(tmp_path, 16, 4))
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["schema"] == "speclens.sweep/1" and sweep["axes"] == {"concurrency": [4, 16]}
    assert [(p["id"], p["dir"], p["status"], p["settings"]["concurrency"]) for p in sweep["points"]] == [
        ("c4", "points/c4", "ok", 4), ("c16", "points/c16", "ok", 16)]  # fmt: skip
    assert (out / "sweep.csv").read_text().splitlines()[1].startswith("c4,sglang,4,")
    assert (out / "report.html").is_file()
    for pid in ("c4", "c16"):
        run = out / "points" / pid
        assert sorted(f.name for f in run.iterdir()) == ["report.html", "summary.json"]
        figures = run_points.summarize(run).estimates
        assert figures["tpot_ms"] == pytest.approx(10.5)  # the published mean TPOT
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["cfg"]  # nothing staged is left


def test_write_point_refuses_a_directory_that_is_not_empty(tmp_path):
    (s,) = summaries(tmp_path, 4)
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="exists and is not empty") as caught:
        published.write_point(run, s)
    assert caught.value.code == 2 and [p.name for p in run.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    published.write_point(empty, s)
    assert sorted(p.name for p in empty.iterdir()) == ["report.html", "summary.json"]
    with pytest.raises(ValueError, match="aggregate-only"):
        published.write_point(tmp_path / "new", {"settings": {}})


def test_a_sweep_that_fails_part_way_leaves_nothing(tmp_path, monkeypatch):
    import speclens.runs.html_sweep as html

    def broken(_sweep_dir, **_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(html, "write_sweep_report", broken)
    out = tmp_path / "out"
    with pytest.raises(OSError):
        published.write_sweeps(out, {"a": summaries(tmp_path, 4), "b": summaries(tmp_path, 8)})
    assert not out.exists()


def test_write_sweeps_removes_what_it_wrote_when_a_later_sweep_fails(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    bad = summaries(tmp_path, 4) * 2  # concurrency 4 twice
    with pytest.raises(ValueError, match="concurrency given twice"):
        published.write_sweeps(out, {"a": summaries(tmp_path, 4), "b": bad})
    assert list(out.iterdir()) == []


def test_write_sweeps_refuses_an_existing_configuration_before_writing_any(tmp_path):
    out = tmp_path / "out"
    (out / "b").mkdir(parents=True)
    with pytest.raises(InputError, match=r"out/b: the configuration directory exists") as caught:
        published.write_sweeps(out, {"a": summaries(tmp_path, 4), "b": summaries(tmp_path, 8)})
    assert caught.value.code == 2 and [p.name for p in out.iterdir()] == ["b"]


def test_the_written_summary_has_no_nan(tmp_path):
    (s,) = summaries(tmp_path, 4)
    published.write_point(tmp_path / "run", s)
    text = (tmp_path / "run" / "summary.json").read_text()
    assert "NaN" not in text and json.loads(text)["settings"]["concurrency"] == 4
    assert not math.isnan(json.loads(text)["figures"]["latency_ms"]["tpot"]["p50"])
