"""``speclens serve`` start-up under bad input: every refusal exits non-zero with one line naming
the flag or field and what was expected, before any port is bound and never with a traceback;
Ctrl-C while the command is still importing exits 130 quietly.

Names added by the fix are imported inside the tests, so that on the tree before it each test
fails on its own rather than the whole module failing to import.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import launch
from childtime import startup_s
from serverkit import child_env, free_port, serve_command

#: A refused start-up must exit well before this (it pays one torch import at most).
REFUSAL_BOUND_S = 60.0
LOG_LEVELS = ("DEBUG ", "INFO ", "WARNING ", "ERROR ", "CRITICAL ")
SIM = ["--executor", "sim", "--method", "dspark", "--num-speculative-tokens", "3"]
SIM_FORCED = [*SIM, "--spec-decode-acceptance-length", "2"]
DRAFT = ["--method", "draft_model", "--num-speculative-tokens", "3"]


def spec_json(**extra: Any) -> str:
    return json.dumps({"method": "ngram", "num_speculative_tokens": 3, **extra})


def synthetic_json(length: Any) -> str:
    return json.dumps(
        {
            "method": "draft_model",
            "num_speculative_tokens": 3,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": length,
        }
    )


#: (id, arguments ({tmp}: a folder of bad model files), exit code, the one line's exact text or
#: a piece of it). Exit 2: a malformed flag; exit 1: a configuration the engine refuses.
REFUSALS: list[tuple[str, list[str], int, str]] = [
    # 3: start-up said yes, then the engine thread died and every request hung
    (
        "step-cost-string",
        [*SIM_FORCED, "--step-cost", '{"base": "x"}'],
        2,
        "--step-cost: base: expected a finite number >= 0 (seconds), got 'x'",
    ),
    (
        "step-cost-negative",
        [*SIM_FORCED, "--step-cost", '{"per_token": -1e-5}'],
        2,
        "--step-cost: per_token: expected a finite number >= 0 (seconds), got -1e-05",
    ),
    (
        "prompt-lookup-max-string",
        ["--speculative-config", spec_json(prompt_lookup_max="x")],
        2,
        "--speculative-config: prompt_lookup_max: Input should be a valid integer, got 'x'",
    ),
    (
        "prompt-lookup-min-zero",
        ["--speculative-config", spec_json(prompt_lookup_min=0)],
        1,
        "refused: prompt_lookup_min (n-gram length): expected an integer >= 1, got 0",
    ),
    (
        "prompt-lookup-min-above-max",
        ["--speculative-config", spec_json(prompt_lookup_min=5, prompt_lookup_max=3)],
        1,
        "refused: prompt_lookup_min 5 is above prompt_lookup_max 3",
    ),
    (
        "k-is-bool",
        ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": True})],
        2,
        "--speculative-config: num_speculative_tokens: Input should be a valid integer, got True",
    ),
    (
        "synthetic-length-string",
        ["--speculative-config", synthetic_json("2")],
        2,
        "--speculative-config: synthetic_acceptance_length: Input should be a valid number, "
        "got '2'",
    ),
    (
        "synthetic-length-bool",
        ["--speculative-config", synthetic_json(True)],
        2,
        "--speculative-config: synthetic_acceptance_length: Input should be a valid number, "
        "got True",
    ),
    (
        "rejection-sample-method-bogus",
        ["--speculative-config", spec_json(rejection_sample_method="bogus")],
        2,
        "--speculative-config: rejection_sample_method: Input should be 'greedy', "
        "'probabilistic' or 'synthetic', got 'bogus'",
    ),
    (
        "method-numeric",
        ["--speculative-config", json.dumps({"method": 7, "num_speculative_tokens": 3})],
        2,
        "--speculative-config: method: Input should be a valid string, got 7",
    ),
    # 7: tracebacks instead of one line
    (
        "model-missing",
        ["--model", "{tmp}/missing"],
        1,
        "refused: --model {tmp}/missing: no such path",
    ),
    (
        "model-dir-without-config",
        ["--model", "{tmp}/no-config"],
        1,
        "refused: --model {tmp}/no-config: {tmp}/no-config/config.json: missing",
    ),
    (
        "model-empty-gguf",
        ["--model", "{tmp}/empty.gguf"],
        1,
        "refused: --model {tmp}/empty.gguf: not a readable GGUF file",
    ),
    (
        "model-garbage-gguf",
        ["--model", "{tmp}/garbage.gguf"],
        1,
        "refused: --model {tmp}/garbage.gguf: not a readable GGUF file",
    ),
    (
        "draft-model-missing",
        [*DRAFT, "--draft-model", "{tmp}/missing-draft"],
        1,
        "refused: --draft-model {tmp}/missing-draft: no such path",
    ),
    (
        "draft-layers-not-a-number",
        [*DRAFT, "--draft-model", "layers:x"],
        1,
        "refused: --draft-model layers:x: expected layers:N with N a positive integer (the "
        "target's first N layers)",
    ),
    (
        "draft-layers-beyond-target",  # it used to reserve a 999-layer KV pool (67 GB)
        [*DRAFT, "--draft-model", "layers:999"],
        1,
        "refused: --draft-model layers:999: the target dummy has 4 layers; a layer subset takes "
        "1 to 4 of them",
    ),
    ("device-bogus", ["--device", "bogus"], 1, "refused: --device bogus: expected cpu, cuda"),
    (
        "port-above-range",
        ["--port", "70000"],
        2,
        "--port 70000: expected a port number in 0..65535",
    ),
    ("port-negative", ["--port", "-1"], 2, "--port -1: expected a port number in 0..65535"),
    (
        "thinking-maybe",
        [*SIM, "--acceptance-profile", "registry", "--thinking", "maybe"],
        2,
        "--thinking: expected 'on' or 'off'",
    ),
    # 8: start-up accepted what it should refuse
    (
        "k-without-method",
        ["--num-speculative-tokens", "3"],
        1,
        "refused: --num-speculative-tokens 3 needs a speculative method (--method)",
    ),
    ("max-queue-zero", ["--max-queue", "0"], 2, "--max-queue 0: expected at least 1"),
    # issue 19, 15: K had no upper bound (10**20: OverflowError; 10**9: MemoryError)
    (
        "k-beyond-bound",
        [
            *("--executor", "sim", "--method", "dspark", "--num-speculative-tokens", str(10**20)),
            *("--spec-decode-acceptance-length", "2"),
        ],
        2,
        "--num-speculative-tokens 100000000000000000000: expected an integer in 0..64",
    ),
    (
        "k-billion",
        ["--method", "ngram", "--num-speculative-tokens", str(10**9)],
        2,
        "--num-speculative-tokens 1000000000: expected an integer in 0..64",
    ),
    (
        "k-beyond-bound-json",
        ["--executor", "sim", "--speculative-config", synthetic_json(2).replace(": 3,", ": 65,")],
        2,
        "--speculative-config: num_speculative_tokens: expected an integer in 0..64, got 65",
    ),
    ("api-key-empty", ["--api-key", ""], 2, "--api-key: empty"),
    (
        "seed-negative",
        ["--seed", "-1"],
        1,
        "refused: --seed -1: expected an integer in [0, 2**63 - 1]",
    ),
]
if not torch.cuda.is_available():
    REFUSALS.append(
        ("device-cuda-absent", ["--device", "cuda"], 1, "refused: --device cuda: CUDA is not")
    )


@dataclass
class Run:
    returncode: int | None
    stderr: str
    bound: bool
    seconds: float


def run_serve(args: list[str], port: int | None = None) -> Run:
    """Run ``speclens serve`` to its exit (bounded), probing its port the whole time."""
    port = free_port() if port is None else port
    bound, done = threading.Event(), threading.Event()

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
    command = serve_command(args, port)
    if "--port" in args:  # the case sets its own (bad) port: do not add a second one
        command = command[:-2]
    started = time.monotonic()
    try:
        proc = launch.run(command, timeout=REFUSAL_BOUND_S, env=child_env())
        code, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:  # it came up instead of refusing
        code = None
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
    finally:
        done.set()
        prober.join()
    return Run(code, err, bound.is_set(), time.monotonic() - started)


def message_lines(stderr: str) -> list[str]:
    """The non-empty stderr lines that are not logging records."""
    return [
        line for line in stderr.splitlines() if line.strip() and not line.startswith(LOG_LEVELS)
    ]


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bad-models")
    (tmp / "no-config").mkdir()
    (tmp / "no-config" / "model.safetensors").write_bytes(b"")
    (tmp / "empty.gguf").write_bytes(b"")
    (tmp / "garbage.gguf").write_bytes(bytes(range(256)) * 16)
    return tmp


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp))


@pytest.fixture(scope="module")
def refusals(bad_models: Path) -> dict[str, Run]:
    """Every refused start-up, three at a time (each may pay the torch import)."""
    arg_lists = [[_fill(a, bad_models) for a in args] for _, args, _, _ in REFUSALS]
    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = list(pool.map(run_serve, arg_lists))
    return {name: run for (name, *_), run in zip(REFUSALS, runs, strict=True)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("name", "args", "code", "message"), REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_refused_in_one_line_before_binding(
    refusals: dict[str, Run], bad_models: Path, name: str, args: list[str], code: int, message: str
) -> None:
    run = refusals[name]
    assert run.returncode is not None, f"{name}: the server came up\n{run.stderr}"
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == code, run.stderr
    lines = message_lines(run.stderr)
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(_fill(message, bad_models)), lines[0]
    assert not run.bound, f"{name}: something listened on the port"
    assert run.seconds < REFUSAL_BOUND_S


# ---------------------------------------------------------------------------- in-process


def test_engine_config_refuses_bad_types_and_values() -> None:
    """The library refuses what the command line refuses, for callers that build configs."""
    from speclens.engine import ConfigError, EngineConfig, SpeculativeConfig, StepCost

    bad_specs: list[dict[str, Any]] = [
        {"method": "ngram", "num_speculative_tokens": 3, "ngram_max": "x"},
        {"method": "ngram", "num_speculative_tokens": 3, "ngram_min": 4, "ngram_max": 3},
        {"method": 7, "num_speculative_tokens": 3},
        {"num_speculative_tokens": 3},
        {"method": "draft_model", "num_speculative_tokens": 3, "acceptance_length": "2"},
        {"method": "draft_model", "num_speculative_tokens": 3, "acceptance_length": True},
        {"method": "draft_model", "num_speculative_tokens": 3, "draft_model": "layers:0"},
        {"method": "draft_model", "num_speculative_tokens": 3, "seed": -1},
        {"method": "ngram", "num_speculative_tokens": 65},
        {"method": "draft_model", "num_speculative_tokens": 10**9, "acceptance_length": 2.0},
    ]
    for kwargs in bad_specs:
        with pytest.raises(ConfigError):
            SpeculativeConfig(**kwargs)
    bad_configs: list[dict[str, Any]] = [
        {"seed": -1},
        {"seed": 2**63},
        {"device": "bogus"},
        {"step_cost": StepCost(base="x")},  # type: ignore[arg-type]
        {"step_cost": StepCost(draft_base=-1.0)},
        {"step_cost": StepCost(per_seq=float("nan"))},
        {"max_num_seqs": 0},
    ]
    for kwargs in bad_configs:
        with pytest.raises(ConfigError):
            EngineConfig(**kwargs).validate()
    EngineConfig(
        seed=2**63 - 1, step_cost=StepCost(prefill_base=0.0, prefill_per_token=0.0)
    ).validate()


def test_layer_subset_beyond_the_target_refused_before_allocating() -> None:
    from speclens.engine import ConfigError, EngineConfig, SpeculativeConfig
    from speclens.engine.weights import check_models

    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, draft_model="layers:5")
    with pytest.raises(ConfigError, match="the target dummy has 4 layers"):
        check_models(EngineConfig(speculative=spec))
    check_models(EngineConfig(speculative=SpeculativeConfig(
        method="draft_model", num_speculative_tokens=3, draft_model="layers:4"
    )))  # fmt: skip


def test_model_load_errors_are_one_type(bad_models: Path) -> None:
    from speclens.engine.config import ModelLoadError
    from speclens.engine.weights import load_model, model_config

    for name in ("missing", "no-config", "empty.gguf", "garbage.gguf"):
        spec = str(bad_models / name)
        for read in (model_config, load_model):
            with pytest.raises(ModelLoadError) as info:
                read(spec)
            assert info.value.spec == spec
            assert "\n" not in str(info.value)


def test_model_error_inside_the_engine_is_one_line(
    run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What only a full load finds (a bad tensor, the tokenizer) is refused the same way."""
    from speclens.cli import serve
    from speclens.engine.config import ModelLoadError

    def broken(*_: Any, **__: Any) -> None:
        raise ModelLoadError(
            "dummy", "dummy: model.safetensors: lm_head.weight: shape [1], expected [2]"
        )

    monkeypatch.setattr(serve, "run_server", broken)
    code, _out, err = run_cli("serve", "--port", "0")
    assert code == 1
    assert message_lines(err) == [
        "refused: --model dummy: model.safetensors: lm_head.weight: shape [1], expected [2]"
    ]


def test_exposed_host_without_api_key_warns(run_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One warning line when the port is reachable beyond loopback and no key guards it."""
    from speclens.cli import serve

    monkeypatch.setattr(serve, "run_server", lambda *a, **k: None)
    cases = [("0.0.0.0", None, True), ("::", None, True), ("127.0.0.1", None, False)]
    cases += [("localhost", None, False), ("0.0.0.0", "k", False)]
    for host, key, warned in cases:
        code, _out, err = run_cli(
            "serve", "--host", host, "--port", "0", *(["--api-key", key] if key else [])
        )
        assert code == 0, err
        warnings = [line for line in err.splitlines() if line.startswith("WARNING")]
        expected = f"WARNING speclens.serve: --host {host} without --api-key: anyone who can reach"
        assert [w[: len(expected)] for w in warnings] == ([expected] if warned else []), err


# ---------------------------------------------------------------------------- Ctrl-C

#: (id, seconds after start, or the module whose ``-X importtime`` line triggers Ctrl-C: a
#: moment certainly inside the speclens.cli imports, where the 0.4 s of the report lands). The
#: 0.4 s stretch with the machine's load (half the child's measured start-up, when longer): a
#: Ctrl-C the interpreter gets before it runs any of our code is not ours to handle.
INTERRUPTS: list[tuple[str, float | str]] = [("after-0.4s", 0.4), ("during-cli-imports", "typer")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", [w for _, w in INTERRUPTS], ids=[i for i, _ in INTERRUPTS])
def test_ctrl_c_while_starting_exits_130_quietly(when: float | str) -> None:
    command = [sys.executable, "-X", "importtime", "-m", "speclens", "serve"]
    proc = subprocess.Popen(
        [*command, "--port", str(free_port())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stderr is not None
    seen = []
    try:
        if isinstance(when, str):
            while (line := proc.stderr.readline()).rpartition("|")[2].strip() != when:
                assert line, f"{when!r} never imported:\n{''.join(seen[-20:])}"
                seen.append(line)
        else:
            time.sleep(max(when, startup_s() / 2))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = "".join(line for line in err.splitlines(True) if not line.startswith("import time:"))
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert len(message_lines(err)) <= 1, err


def test_the_engine_itself_refuses_a_layer_subset_beyond_the_target() -> None:
    """``Engine(config)`` from Python, with no ``check_models`` call before it, must refuse
    ``layers:999`` instead of sizing a 999-layer KV pool."""
    from speclens.engine import ConfigError, Engine, EngineConfig, SpeculativeConfig

    spec = SpeculativeConfig(
        method="draft_model", num_speculative_tokens=3, draft_model="layers:999"
    )
    with pytest.raises(ConfigError, match="the target has 4 layers"):
        Engine(EngineConfig(speculative=spec, kv_cache_tokens=4096))
