"""Honest tails, end to end on the real SmolLM2 (model tier): from a natural n-gram run on
Spec-Bench's 13 categories, ``profiles from-run`` writes a measured profile with its spread;
``speclens serve --model dummy`` forced with it and loaded by ``bench`` passes a verdict that
checks the spread, and one forced at the same AL without it fails; ``speclens sim`` of the same
workload with that profile and a step cost calibrated on the natural runs predicts the natural
run's TPOT p90 within 10%.

The prediction is held at concurrency 1, where the tails are acceptance's alone (at 2 another
request's prefill stalls a decode, which ``benchmarks/spread.py`` reports beside it); its 10% is
the issue's goal, which the benchmark meets with room on twice the requests. The natural run's
p90 rests on 39 requests, so a machine far noisier than the calibration run saw moves it: the
test is marked ``quiet`` and runs alone (in CI, beside another model test, the natural run came
out 10.5% slower than its calibration predicted)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from serverkit import running_servers

pytestmark = [pytest.mark.model, pytest.mark.quiet]

SPEC_BENCH = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"  # fmt: skip
NGRAM = '{"prompt_lookup_min": 2, "prompt_lookup_max": 4}'
MAX_TOKENS = 64
GOAL = 0.10

needs_prompts = pytest.mark.skipif(not SPEC_BENCH.is_file(), reason="Spec-Bench prompts absent")


def _bench(run_cli: Any, url: str, model: str, out: Path | None, concurrency: int,
           requests: int, *extra: str | Path) -> tuple[int, str]:  # fmt: skip
    dataset = (["--dataset", "jsonl", "--dataset-path", SPEC_BENCH] if model != "dummy"
               else ["--dataset", "random"])  # fmt: skip
    code, stdout, stderr = run_cli(
        "bench", "--url", url, "--model", model, "--max-tokens", MAX_TOKENS, "--ignore-eos",
        "--stream", "--concurrency", concurrency, "--num-requests", requests, *dataset,
        *(["--output-dir", out] if out else []), *extra,
    )  # fmt: skip
    return code, stdout + stderr


@pytest.fixture(scope="module")
def natural(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The natural run at concurrency 1 (39 requests: three of each category) and a second load
    point for the calibration at 2 (26), SmolLM2 with n-gram drafting K 4."""
    import logging

    from typer.testing import CliRunner

    from speclens.cli import app

    def run_cli(*args: str | Path) -> tuple[int, str, str]:
        """The ``run_cli`` fixture's call, for a module-scoped fixture."""
        try:
            result = CliRunner().invoke(app, [str(a) for a in args])
        finally:
            logging.getLogger().handlers.clear()
        return result.exit_code, result.stdout, result.stderr

    work = tmp_path_factory.mktemp("spread-smollm2")
    args = ["--model", "smollm2", "--method", "ngram", "--num-speculative-tokens", "4",
            "--per-request-spec-decode-stats", "summary", "--speculative-config", NGRAM]  # fmt: skip
    with running_servers(work, args) as (server,):
        for name, concurrency, requests in (("c1", 1, 39), ("c2", 2, 26)):
            code, text = _bench(run_cli, server.url, "smollm2", work / name, concurrency, requests)
            assert code == 0, text
    yield work / "c2", work / "c1"


def _scenario(work: Path, profile: dict[str, Any], natural: Path) -> Path:
    lengths = [json.loads(line)["prompt_tokens"]
               for line in (natural / "records.jsonl").read_text().splitlines()]  # fmt: skip
    value = {"num_spec_tokens": 4, "acceptance_length": profile["acceptance_length"],
             "draft_coverage": profile["draft_coverage"], "spread": profile["spread"]}  # fmt: skip
    doc = {
        "model": "smollm2-135m",
        "deployment": {"pools": [{"parallel": 1, "step_cost_file": str(work / "cost.yaml"),
                                  "engine": {"speculative": {"method": "ngram", "num_spec_tokens": 4},
                                             "max_num_seqs": 1, "max_model_len": 4096}}]},
        "workload": {"input_tokens": {"values": lengths}, "output_tokens": MAX_TOKENS,
                     "concurrency": 1, "requests": 2000, "acceptance": value},
    }  # fmt: skip
    path = work / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _tpot_p90(run: Path) -> float:
    summary = json.loads((run / "summary.json").read_text())
    return float(summary["figures"]["latency_ms"]["tpot"]["p90"])


@needs_prompts
@pytest.mark.timeout(900)
def test_a_natural_run_s_spread_is_stated_forced_judged_and_simulated(
    run_cli: Any, natural: tuple[Path, Path], tmp_path: Path
) -> None:
    calibration, run = natural
    code, out, err = run_cli("profiles", "from-run", run, "--category", "spec-bench",
                             "-o", tmp_path / "measured.yaml")  # fmt: skip
    assert code == 0, out + err
    (profile,) = yaml.safe_load((tmp_path / "measured.yaml").read_text())["profiles"]
    spread = profile["spread"]
    assert spread["requests"] == 39 and spread["num_spec_tokens"] == 4
    (tmp_path / "spread.yaml").write_text(yaml.safe_dump(spread))
    al = str(profile["acceptance_length"])

    forced = ["--method", "draft_model", "--num-speculative-tokens", "4",
              "--spec-decode-acceptance-length", al, "--per-request-spec-decode-stats", "summary",
              "--max-num-seqs", "32"]  # fmt: skip
    with running_servers(tmp_path, [*forced, "--spec-decode-acceptance-spread",
                                    str(tmp_path / "spread.yaml")], forced) as both:  # fmt: skip
        with_spread, without = both[0], both[1]
        expect = ("--expect-acceptance-length", al, "--expect-acceptance-spread",
                  tmp_path / "spread.yaml")  # fmt: skip
        code, text = _bench(run_cli, with_spread.url, "dummy", None, 16, 120, *expect)
        assert code == 0 and "spread check PASS" in text, text
        code, text = _bench(run_cli, without.url, "dummy", None, 16, 120, *expect)
        assert code == 1 and "spread check FAIL" in text, text

    code, out, err = run_cli("calibrate", calibration, run, "-o", tmp_path / "cost.yaml")
    assert code == 0, out + err
    code, out, err = run_cli("sim", _scenario(tmp_path, profile, run),
                             "--output-dir", tmp_path / "sim")  # fmt: skip
    assert code == 0, out + err
    assert "spread: each request draws its own AL" in out
    predicted, measured = _tpot_p90(tmp_path / "sim"), _tpot_p90(run)
    assert abs(predicted / measured - 1) <= GOAL, (predicted, measured)
