"""Startup of the real command: every refusal exits non-zero with its message on stderr before a
port is bound; forced acceptance logs its schedule once; the vLLM ``--speculative-config``
spelling is equivalent; golden-AL replay resolves from the registry and says where from."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import launch
from serverkit import (
    FORCED,
    SCHEDULE_LINE,
    ServerProcess,
    check_choice_stats,
    child_env,
    free_port,
    mtp_stats,
    serve_command,
)

pytestmark = pytest.mark.integration

SPEC_JSON = json.dumps(
    {
        "method": "draft_model",
        "num_speculative_tokens": 7,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 3.78,
    }
)
GOLDEN = [
    "--served-model-name",
    "kimi-k3",
    "--method",
    "dspark",
    "--num-speculative-tokens",
    "7",
    "--executor",
    "sim",
    "--acceptance-profile",
    "registry",
    "--thinking",
    "on",
]
K7 = ["--method", "draft_model", "--num-speculative-tokens", "7"]

#: (id, arguments, a piece of the message stderr must carry)
REFUSALS: list[tuple[str, list[str], str]] = [
    (
        "both-spellings",
        [*FORCED, "--spec-decode-acceptance-rate", "0.4"],
        "--spec-decode-acceptance-length and --spec-decode-acceptance-rate describe the same "
        "target; set only one",
    ),
    (
        "length-above-k-plus-1",
        [*K7, "--spec-decode-acceptance-length", "8.01"],
        "is outside [1, num_speculative_tokens + 1] = [1, 8]",
    ),
    (
        "length-below-1",
        [*K7, "--spec-decode-acceptance-length", "0.99"],
        "--spec-decode-acceptance-length 0.99 is outside [1, num_speculative_tokens + 1]",
    ),
    (
        "rate-above-1",
        [*K7, "--spec-decode-acceptance-rate", "1.5"],
        "--spec-decode-acceptance-rate 1.5 is outside [0, 1]",
    ),
    (
        "forced-without-method",
        ["--num-speculative-tokens", "7", "--spec-decode-acceptance-length", "3.78"],
        "forced acceptance needs a speculative method (--method) and a non-zero "
        "--num-speculative-tokens",
    ),
    (
        "forced-with-k-0",
        ["--method", "draft_model", "--num-speculative-tokens", "0", *FORCED[-2:]],
        "num_speculative_tokens >= 1",
    ),
    (
        "forced-with-confidence-schedule",
        [*FORCED, "--confidence-schedule"],
        "forced acceptance cannot run with the confidence schedule",
    ),
    (
        "sim-without-forced-acceptance",
        ["--executor", "sim", *K7],
        "the sim executor runs no model, so acceptance must be forced or stated",
    ),
    ("speculative-config-not-json", ["--speculative-config", "{bad"], "not valid JSON"),
    (
        "speculative-config-unknown-key",
        ["--speculative-config", '{"num_spec_tokens": 7}'],
        "unknown keys ['num_spec_tokens']",
    ),
    (
        "speculative-config-contradicts-flag",
        ["--speculative-config", SPEC_JSON, "--num-speculative-tokens", "5"],
        "--num-speculative-tokens 5 contradicts --speculative-config num_speculative_tokens: 7",
    ),
    (
        "golden-al-missing-category",
        GOLDEN,
        "refused: cannot look up kimi-k3/dspark/k7/thinking-on: the workload states no category",
    ),
]


@dataclass
class Refused:
    returncode: int | None
    stdout: str
    stderr: str
    port: int
    bound: bool
    seconds: float


def _run_refused(args: list[str]) -> Refused:
    """Run the command to its exit, trying to connect to its port the whole time."""
    port = free_port()
    bound = threading.Event()
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=0.2),
            ):
                bound.set()
            time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    started = time.monotonic()
    try:
        proc = launch.run(serve_command(args, port), timeout=90, env=child_env())
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:  # it came up instead of refusing
        code = None
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
    finally:
        done.set()
        prober.join()
    return Refused(code, out, err, port, bound.is_set(), time.monotonic() - started)


@pytest.fixture(scope="module")
def refusals() -> dict[str, Refused]:
    """Every refused command, run a few at a time (each pays the torch import)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = pool.map(_run_refused, [args for _, args, _ in REFUSALS])
        return {name: result for (name, _, _), result in zip(REFUSALS, results, strict=True)}


@pytest.mark.parametrize(("name", "args", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_at_startup(
    refusals: dict[str, Refused], name: str, args: list[str], message: str
) -> None:
    result = refusals[name]
    assert result.returncode is not None, f"{name}: the server came up\n{result.stderr}"
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert message not in result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert "speclens serving" not in result.stderr + result.stdout
    assert "Forced speculative acceptance ON" not in result.stderr
    assert not result.bound, f"{name}: something listened on port {result.port}"


# ---------------------------------------------------------------------------- servers that start

RATE = repr((3.78 - 1) / 7)


@pytest.fixture(scope="module")
def started(serve: Any) -> dict[str, ServerProcess]:
    names = ["flags", "json", "rate", "golden"]
    arg_lists = [
        [*FORCED, "--per-request-spec-decode-stats", "detailed"],
        ["--speculative-config", SPEC_JSON, "--per-request-spec-decode-stats", "detailed"],
        [*K7, "--spec-decode-acceptance-rate", RATE],
        [*GOLDEN, "--category", "coding", "--per-request-spec-decode-stats", "summary"],
    ]
    return dict(zip(names, serve(*arg_lists), strict=True))


def _version(server: ServerProcess) -> dict[str, Any]:
    r = httpx.get(server.url + "/version", timeout=10)
    assert r.status_code == 200
    return dict(r.json())


@pytest.mark.parametrize("name", ["flags", "json", "golden"])
def test_schedule_line_logged_exactly_once(started: dict[str, ServerProcess], name: str) -> None:
    log = started[name].log()
    assert log.count(SCHEDULE_LINE) == 1, log
    assert log.count("Forced speculative acceptance ON") == 1


def test_rate_spelling_resolves_to_the_same_schedule(started: dict[str, ServerProcess]) -> None:
    log = started["rate"].log()
    assert log.count("Forced speculative acceptance ON: mean acceptance length 3.7800 over 7") == 1
    acceptance = _version(started["rate"])["acceptance"]
    assert acceptance["acceptance_length"] == pytest.approx(3.78)
    assert acceptance["per_position_rates"] == pytest.approx([1, 1, 0.78, 0, 0, 0, 0])


def test_version_reports_the_forced_target(started: dict[str, ServerProcess]) -> None:
    version = _version(started["flags"])
    assert version["model"] == "dummy" and version["executor"] == "torch"
    assert version["dtype"] == "float32"  # the weights' dtype, serve's --dtype
    assert version["acceptance"] == {
        "method": "draft_model",
        "num_speculative_tokens": 7,
        "forced": True,
        "acceptance_length": 3.78,
        "per_position_rates": [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0],
        "spread": None,
        "spread_note": "spread unknown: tails are minimum-variance, optimistic",
    }


def test_speculative_config_is_equivalent(started: dict[str, ServerProcess]) -> None:
    """Same settings, same seed: the JSON spelling serves byte-for-byte what the flags serve."""
    flags, spec_json = started["flags"], started["json"]
    assert _version(flags) == _version(spec_json)
    body = {
        "prompt": "Equivalence check.",
        "max_tokens": 96,
        "temperature": 0,
        "ignore_eos": True,
    }
    a = httpx.post(flags.url + "/v1/completions", json=body, timeout=60).json()
    b = httpx.post(spec_json.url + "/v1/completions", json=body, timeout=60).json()
    for data in (a, b):
        check_choice_stats(data["choices"][0]["speculative_decoding_stats"], "detailed")
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert (
        a["choices"][0]["speculative_decoding_stats"]
        == b["choices"][0]["speculative_decoding_stats"]
    )
    assert a["metrics"] == b["metrics"] and a["usage"] == b["usage"]
    assert mtp_stats(flags.url) == mtp_stats(spec_json.url)


def test_golden_al_replay(started: dict[str, ServerProcess]) -> None:
    server = started["golden"]
    log = server.log()
    provenance = (
        "Acceptance profile: 3.78 from the registry layer (inferencex-golden-al-2026-08: "
        "kimi-k3/dspark/k7/thinking-on/coding, method measured); source: "
        "https://github.com/SemiAnalysisAI/InferenceX/blob/843c6254f/golden_al_distribution/"
        "kimik3_dspark.yaml"
    )
    assert log.count(provenance) == 1, log
    # ... logged beside the schedule line.
    lines = log.splitlines()
    where = [i for i, line in enumerate(lines) if provenance in line]
    schedule = [i for i, line in enumerate(lines) if SCHEDULE_LINE in line]
    assert len(where) == len(schedule) == 1
    assert abs(where[0] - schedule[0]) == 1
    version = _version(server)
    assert version["model"] == "kimi-k3" and version["executor"] == "sim"
    acceptance = version["acceptance"]
    assert acceptance["method"] == "dspark"
    assert acceptance["num_speculative_tokens"] == 7
    assert acceptance["forced"] is True
    assert acceptance["acceptance_length"] == 3.78
    assert acceptance["per_position_rates"] == [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]
    resolution = acceptance["resolution"]
    assert resolution["acceptance_length"] == 3.78
    assert resolution["layer"] == "registry"
    assert resolution["profile_set"] == "inferencex-golden-al-2026-08"
    assert resolution["profile"] == "kimi-k3/dspark/k7/thinking-on/coding"
    assert resolution["category"] == "coding"
    assert resolution["num_spec_tokens"] == 7
    assert resolution["method"] == "measured"
    assert resolution["fallback_used"] is False
    assert resolution["source"].endswith("/golden_al_distribution/kimik3_dspark.yaml")
    # It serves under the name it resolved for, and speculates at the replayed schedule.
    models = httpx.get(server.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["kimi-k3"]
    r = httpx.post(
        server.url + "/v1/completions",
        json={"model": "kimi-k3", "prompt": "golden", "max_tokens": 64, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200
    check_choice_stats(r.json()["choices"][0]["speculative_decoding_stats"], "summary")
    assert set(mtp_stats(server.url)["distribution"]) <= {"2", "3"}
    wrong = httpx.post(
        server.url + "/v1/completions", json={"model": "dummy", "prompt": "x"}, timeout=60
    )
    assert wrong.status_code == 400
