"""--sampling: the order a prompt file is sent in. The default, category round-robin (seeded),
covers every category in the first requests; the choice is recorded in the run's settings, and a
category whose AL rests on few verify steps is warned about."""

from __future__ import annotations

import io
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from speclens.bench.datasets import Prompt, jsonl_prompts, sample_prompts
from speclens.cli import bench as bench_cli
from speclens.runs.verify import thin_categories

SPEC_BENCH = Path(__file__).parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"


def prompts(counts: dict[str, int]) -> list[Prompt]:
    return [Prompt(f"{c} {i}", c, None, f"{c}{i}") for c, n in counts.items() for i in range(n)]


def test_round_robin_takes_one_of_each_category_in_turn() -> None:
    rows = prompts({"a": 5, "b": 2, "c": 3})
    out = sample_prompts(rows, "category-round-robin", 0)
    assert sorted(p.id for p in out) == sorted(p.id for p in rows)  # a permutation
    assert {p.category for p in out[:3]} == {"a", "b", "c"}
    assert {p.category for p in out[3:6]} == {"a", "b", "c"}
    assert {p.category for p in out[6:8]} == {"a", "c"}  # b has run out
    assert [p.category for p in out[8:]] == ["a", "a"]
    assert sample_prompts(rows, "category-round-robin", 0) == out  # seeded
    seeds = {tuple(p.id for p in sample_prompts(rows, "category-round-robin", s)) for s in range(5)}
    assert len(seeds) > 1  # the seed moves the order


def test_shuffle_and_in_order() -> None:
    rows = prompts({"a": 10, "b": 10})
    assert sample_prompts(rows, "in-order", 3) == rows
    shuffled = sample_prompts(rows, "shuffle", 3)
    assert shuffled != rows and sorted(p.id for p in shuffled) == sorted(p.id for p in rows)
    assert sample_prompts(rows, "shuffle", 3) == shuffled
    with pytest.raises(ValueError, match="sampling: expected one of"):
        sample_prompts(rows, "random", 0)


@pytest.mark.skipif(not SPEC_BENCH.exists(), reason="the shared Spec-Bench file is absent")
def test_40_spec_bench_requests_cover_all_13_categories_by_default() -> None:
    rows = jsonl_prompts(SPEC_BENCH)
    assert len({p.category for p in rows}) == 13
    for seed in (0, 1, 7):
        first = sample_prompts(rows, "category-round-robin", seed)[:40]
        counts = Counter(p.category for p in first)
        assert len(counts) == 13 and max(counts.values()) - min(counts.values()) <= 1
    assert len({p.category for p in sample_prompts(rows, "in-order", 0)[:40]}) < 13


def options(tmp_path: Path, **changes: Any) -> bench_cli.BenchOptions:
    path = tmp_path / "q.jsonl"
    path.write_text(
        "".join(
            f'{{"question_id": {i}, "category": "c{i % 3}", "turns": ["q{i}"]}}\n' for i in range(9)
        )
    )
    flags = dict(
        url=["http://127.0.0.1:9"], routing=bench_cli.RoutingChoice.round_robin, workers=1,
        shard=None, api_key=None, model="m", endpoint=bench_cli.EndpointChoice.completions,
        backend=bench_cli.BackendChoice.openai, dataset="jsonl", dataset_path=path, category=[],
        input_len=8, num_requests=6, duration=None, concurrency=None, request_rate=None,
        burstiness=1.0, warmup=0, max_tokens=8, ignore_eos=False, temperature=0.0, seed=0,
        stream=True, slo=None, expect_acceptance_length=None, expect_profile=False, method=None,
        num_spec_tokens=None, thinking=None, registry=[], output_dir=None, timeout=10.0,
        max_failure_rate=0.0,
    )  # fmt: skip
    flags.update(changes)
    return bench_cli.BenchOptions(**flags)  # type: ignore[arg-type]


def test_the_options_default_to_round_robin_and_settings_record_the_sampling(
    tmp_path: Path,
) -> None:
    default = options(tmp_path)
    rows = default.prompts()
    assert [p.category for p in rows[:3]] != ["c0", "c0", "c0"]
    assert {p.category for p in rows[:3]} == {"c0", "c1", "c2"}
    in_order = options(tmp_path, sampling=bench_cli.SamplingChoice.in_order)
    assert [p.id for p in in_order.prompts()] == [str(i) for i in range(9)]
    config = default.load_config("openai")
    a = default.settings(config, None, rows)
    b = in_order.settings(config, None, in_order.prompts())
    assert (a["prompt_sampling"], b["prompt_sampling"]) == ("category-round-robin", "in-order")
    assert a["prompts_sha256"] != b["prompts_sha256"]  # compare tells them apart
    # a fresh run says it records every field compare checks, so none is called "old"
    assert a["settings_schema"] == "speclens.settings/2"


def summary(steps: dict[str, int]) -> dict[str, Any]:
    rows = {c: {"al": 2.0, "verify_steps": n} for c, n in steps.items()}
    return {"figures": {"acceptance": {"al_by_category": rows}}}


def test_a_category_resting_on_under_30_verify_steps_is_warned_about() -> None:
    assert thin_categories(summary({"a": 30, "b": 30})) == []
    assert thin_categories(summary({"a": 29, "b": 300, "c": 3})) == [
        "2 of 3 categories have an AL resting on fewer than 30 verify steps: a (29), c (3); "
        "send more requests to read them"
    ]


def test_progress_lines_every_interval_when_not_a_terminal(monkeypatch: Any) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(bench_cli, "err_console", Console(file=buffer, width=200))
    done = [0]
    with bench_cli.progress_lines(lambda: done[0], 10, True, every=0.05):
        for _ in range(4):
            done[0] += 1
            time.sleep(0.06)
    lines = buffer.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("bench: ") for line in lines)
    assert "/10 requests finished" in lines[-1]
    buffer.truncate(0)
    with bench_cli.progress_lines(lambda: 0, 10, False, every=0.01):
        time.sleep(0.05)
    assert buffer.getvalue() == ""
    assert not any(t.name == "speclens-progress" for t in threading.enumerate())
