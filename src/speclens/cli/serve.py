"""``speclens serve``: the engine behind an OpenAI-compatible HTTP server.

Flags follow vLLM and ATOM. Every startup refusal exits non-zero with its message before a port
is bound; forced acceptance logs its resolved schedule once.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import signal
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import typer
from pydantic import BaseModel, ConfigDict

from speclens.acceptance import MAX_NUM_SPEC_TOKENS, ValidationError, validate
from speclens.cli._common import REGISTRY_OPTION, fail, interrupt_deferred, load_registry

log = logging.getLogger("speclens.serve")
#: ``--collective-timeout``'s floor: under it, ordinary waits on a busy machine would stop the
#: server.
MIN_COLLECTIVE_TIMEOUT_S = 0.5


class StatsChoice(StrEnum):
    none = "none"
    summary = "summary"
    detailed = "detailed"


class ExecutorChoice(StrEnum):
    torch = "torch"
    sim = "sim"


class DtypeChoice(StrEnum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


def resolve_dtype(choice: str, device: str) -> str:
    """``--dtype auto``: bfloat16 where the device multiplies it natively (a CPU with AVX-512
    BF16 or AMX, a CUDA device that supports it), where it reads half the bytes of float32 at
    least as fast; float32 elsewhere. Any other choice is kept as given."""
    if choice != "auto":
        return choice
    import torch

    from speclens.engine.model import native_bf16

    if device.startswith("cuda"):
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    else:
        native = device == "cpu" and native_bf16()
    return "bfloat16" if native else "float32"


class _SpeculativeJSON(BaseModel):
    """The types of ``--speculative-config`` keys (vLLM's names): a wrong type is refused here,
    not inside the engine thread. Strict: no bool for an int, no string for a number."""

    model_config = ConfigDict(strict=True, extra="forbid")

    method: str | None = None
    num_speculative_tokens: int | None = None
    model: str | None = None
    #: The engine picks greedy/probabilistic from each request's temperature; only synthetic
    #: changes what runs.
    rejection_sample_method: Literal["greedy", "probabilistic", "synthetic"] | None = None
    synthetic_acceptance_length: float | None = None
    synthetic_acceptance_rate: float | None = None
    synthetic_acceptance_rates: list[float] | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None


def _prompt_lookup(spec_json: dict[str, Any], defaults: tuple[int, int]) -> tuple[int, int]:
    """(min, max) n-gram lengths with vLLM's rule (``vllm/config/speculative.py``): neither
    given, the defaults (``SpeculativeConfig``'s, vLLM's 5 and 5); one given, it sets both (a bad
    minimum alone is refused under its own name)."""
    lo: int | None = spec_json.get("prompt_lookup_min")
    hi: int | None = spec_json.get("prompt_lookup_max")
    if hi is None:
        return defaults if lo is None else (lo, max(lo, 1))
    return (hi if lo is None else lo), hi


def _speculative_json(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"--speculative-config: not valid JSON: {exc}", code=2)
    if not isinstance(data, dict):
        fail("--speculative-config: expected a JSON object", code=2)
    known = set(_SpeculativeJSON.model_fields)
    unknown = sorted(set(data) - known)
    if unknown:
        fail(f"--speculative-config: unknown keys {unknown}; known: {sorted(known)}", code=2)
    try:
        validate(_SpeculativeJSON, data, "--speculative-config")
    except ValidationError as exc:
        fail(
            (f"{p}, got {_key_value(data, p.path)!r}" for p in exc.problems),
            code=2,
        )
    k = data.get("num_speculative_tokens")
    if k is not None and not 0 <= k <= MAX_NUM_SPEC_TOKENS:
        fail(
            "--speculative-config: num_speculative_tokens: expected an integer in "
            f"0..{MAX_NUM_SPEC_TOKENS}, got {k}",
            code=2,
        )
    method = data.get("rejection_sample_method")
    synthetic = {
        "synthetic_acceptance_length",
        "synthetic_acceptance_rate",
        "synthetic_acceptance_rates",
    }
    if method not in (None, "synthetic") and synthetic & set(data):
        fail(
            "--speculative-config: synthetic_acceptance_* needs rejection_sample_method synthetic",
            code=2,
        )
    if method == "synthetic" and not synthetic & set(data):
        fail(
            "--speculative-config: rejection_sample_method synthetic needs "
            "synthetic_acceptance_length or synthetic_acceptance_rates",
            code=2,
        )
    return data


def _key_value(data: dict[str, Any], path: str) -> Any:
    """The value at a problem's path (``key`` or ``key[i]``), to show what was refused."""
    key, _, rest = path.partition("[")
    value = data.get(key)
    if rest and isinstance(value, list):
        index = int(rest.rstrip("]"))
        return value[index] if index < len(value) else None
    return value


def _check_k(k: int | None) -> None:
    """``--num-speculative-tokens`` within the one K bound, before K sizes anything."""
    if k is not None and not 0 <= k <= MAX_NUM_SPEC_TOKENS:
        fail(
            f"--num-speculative-tokens {k}: expected an integer in 0..{MAX_NUM_SPEC_TOKENS} "
            "(draft tokens per step)",
            code=2,
        )


def _server_flags(port: int, max_queue: int, api_key: str | None) -> None:
    """The HTTP server's own flags (the engine checks the rest): refused before anything loads."""
    if not 0 <= port <= 65535:
        fail(f"--port {port}: expected a port number in 0..65535 (0: any free port)", code=2)
    if max_queue < 1:
        fail(f"--max-queue {max_queue}: expected at least 1 waiting request", code=2)
    if api_key is not None and not api_key.strip():
        fail(
            "--api-key: empty; give a non-empty key, or omit the flag to serve without one", code=2
        )


def _check_collective_timeout(seconds: float) -> None:
    if not (math.isfinite(seconds) and MIN_COLLECTIVE_TIMEOUT_S <= seconds <= 86400):
        fail(
            f"--collective-timeout {seconds:g}: expected seconds in "
            f"{MIN_COLLECTIVE_TIMEOUT_S:g}..86400",
            code=2,
        )


def _warn_if_exposed(host: str, api_key: str | None) -> None:
    """Binding beyond loopback without a key serves anyone who can reach the port."""
    if api_key:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        log.warning(
            "--host %s without --api-key: anyone who can reach this port can use the server",
            host,
        )


def _step_cost(text: str | None, cls: Any) -> Any:
    """``--step-cost``: a JSON object of StepCost fields, or a YAML file (``speclens calibrate``'s
    output, or a bare mapping of the fields)."""
    if not text:
        return cls()
    if not text.lstrip().startswith("{"):
        from speclens.acceptance import ValidationError
        from speclens.sim.calibrate import read_cost_file

        try:
            return read_cost_file(Path(text))[0]
        except ValidationError as exc:
            fail((f"--step-cost: {p}" for p in exc.problems), code=2)
    try:
        cost = cls(**json.loads(text))
    except (json.JSONDecodeError, TypeError) as exc:
        fail(f"--step-cost: expected a JSON object of StepCost fields: {exc}", code=2)
    problems = cost.problems()
    if problems:
        fail((f"--step-cost: {p}" for p in problems), code=2)
    return cost


def _model_refusal(exc: Any, model: str) -> str:
    """``refused: --model X: what is wrong`` (or ``--draft-model``) for a ``ModelLoadError``."""
    flag = "--model" if exc.spec == model else "--draft-model"
    return f"refused: {flag} {exc.spec}: {str(exc).removeprefix(f'{exc.spec}: ')}"


def _merge(flag: Any, key: str, config: dict[str, Any], name: str) -> Any:
    value = config.get(key)
    if flag is not None and value is not None and flag != value:
        fail(f"{name} {flag} contradicts --speculative-config {key}: {value}", code=2)
    return flag if flag is not None else value


def serve(
    model: str = typer.Option(
        "dummy", "--model", help="dummy (embedded), smollm2, a HF directory or a .gguf file."
    ),
    draft_model: str | None = typer.Option(
        None,
        "--draft-model",
        help="The drafter: dummy-draft, a path, or layers:N (a layer subset of the target).",
    ),
    method: str | None = typer.Option(
        None, "--method", help="Speculative method: draft_model or ngram (sim prices any name)."
    ),
    num_speculative_tokens: int | None = typer.Option(
        None, "--num-speculative-tokens", help="K, draft tokens per step."
    ),
    acceptance_length: float | None = typer.Option(
        None,
        "--spec-decode-acceptance-length",
        help="Force this mean acceptance length, in [1, K + 1].",
    ),
    acceptance_rate: float | None = typer.Option(
        None,
        "--spec-decode-acceptance-rate",
        help="Force this acceptance rate, in [0, 1] (length = 1 + K * rate).",
    ),
    acceptance_spread: Path | None = typer.Option(
        None,
        "--spec-decode-acceptance-spread",
        help="With a forced length or rate: a YAML file of per-request AL quantiles "
        "(num_spec_tokens, quantiles p0..p100, requests, tolerance, source); each request draws "
        "its own AL from it. An --acceptance-profile's own spread is used without it.",
    ),
    draft_coverage: float = typer.Option(
        1.0,
        "--spec-decode-draft-coverage",
        help="With forced acceptance: the share of decode steps that draft, in (0, 1] (the rest "
        "are plain steps, as when an n-gram lookup finds no match).",
    ),
    speculative_config: str | None = typer.Option(
        None,
        "--speculative-config",
        help="vLLM-style JSON: method, num_speculative_tokens, model, rejection_sample_method, synthetic_acceptance_length, synthetic_acceptance_rates.",
    ),
    confidence_schedule: bool = typer.Option(
        False,
        "--confidence-schedule",
        help="Let the drafter stop before K when its confidence is low.",
    ),
    acceptance_profile: str | None = typer.Option(
        None,
        "--acceptance-profile",
        help="Replay a golden AL from the registry: a set name, or 'registry' for every set.",
    ),
    thinking: str | None = typer.Option(
        None, "--thinking", help="Thinking mode for --acceptance-profile (on or off)."
    ),
    category: str | None = typer.Option(
        None, "--category", help="Workload category for --acceptance-profile."
    ),
    hardware: str | None = typer.Option(
        None, "--hardware", help="This run's chip, recorded against the profile's."
    ),
    registry: list[Path] = REGISTRY_OPTION,
    stats_level: StatsChoice = typer.Option(
        StatsChoice.none,
        "--per-request-spec-decode-stats",
        "--per-request-spec-decode-metrics",
        help="Per-request acceptance on responses.",
    ),
    force_include_usage: bool = typer.Option(
        False,
        "--enable-force-include-usage",
        help="vLLM's flag: end every stream with the usage chunk (and the root metrics), "
        "whatever the request's stream_options.",
    ),
    executor: ExecutorChoice = typer.Option(
        ExecutorChoice.torch,
        "--executor",
        help="torch (real forward passes) or sim (priced steps, no model).",
    ),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", "--server-port"),
    api_key: str | None = typer.Option(
        None, "--api-key", help="Require 'Authorization: Bearer KEY' on /v1/*."
    ),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="The model name clients use (default: --model)."
    ),
    max_model_len: int | None = typer.Option(
        None,
        "--max-model-len",
        help="Default: 2048, or the model's max_position_embeddings when smaller.",
    ),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs"),
    max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens"),
    kv_cache_tokens: int = typer.Option(131072, "--kv-cache-tokens", help="KV capacity in tokens."),
    max_queue: int = typer.Option(
        4096, "--max-queue", help="Waiting requests before answering 503."
    ),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("cpu", "--device"),
    dtype: DtypeChoice = typer.Option(
        DtypeChoice.float32,
        "--dtype",
        help="Weights, activations and KV cache: float32, bfloat16, or auto (bfloat16 where the "
        "device multiplies it natively, e.g. a CPU with AVX-512 BF16 or AMX; else float32). "
        "bfloat16 reads half the bytes; its greedy text is not float32's token for token.",
    ),
    tensor_parallel_size: int = typer.Option(
        1,
        "--tensor-parallel-size",
        "-tp",
        help="Rank processes the model is split over (gloo on a CPU, NCCL on CUDA).",
    ),
    debug_lockstep: bool = typer.Option(
        False,
        "--debug-lockstep",
        help="Ranks compare a checksum of their accepted counts every step (one all-reduce).",
    ),
    collective_timeout: float = typer.Option(
        60.0,
        "--collective-timeout",
        help="Tensor parallelism: seconds rank 0 waits in one collective before it calls a rank "
        "stopped or hung, fails every request and stops the server.",
    ),
    step_cost: str | None = typer.Option(
        None,
        "--step-cost",
        help="sim executor: JSON of StepCost fields (seconds), e.g. '{\"base\": 0.002}', or a "
        "step-cost YAML file (speclens calibrate's output).",
    ),
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API."""
    ServeArgs(**locals()).run()


@dataclass
class _Speculation:
    """The speculative settings once flags and ``--speculative-config`` are merged."""

    method: str | None
    k: int | None
    draft_model: str | None
    length: float | None
    rate: float | None
    rates: list[float] | None


@dataclass
class ServeArgs:
    """``serve``'s options, one field per flag (as vLLM's ``EngineArgs``): the command only
    collects them; the methods check them, in order, and build what runs."""

    model: str
    draft_model: str | None
    method: str | None
    num_speculative_tokens: int | None
    acceptance_length: float | None
    acceptance_rate: float | None
    acceptance_spread: Path | None
    draft_coverage: float
    speculative_config: str | None
    confidence_schedule: bool
    acceptance_profile: str | None
    thinking: str | None
    category: str | None
    hardware: str | None
    registry: list[Path]
    stats_level: StatsChoice
    force_include_usage: bool
    executor: ExecutorChoice
    host: str
    port: int
    api_key: str | None
    served_model_name: str | None
    max_model_len: int | None
    max_num_seqs: int
    max_num_batched_tokens: int | None
    kv_cache_tokens: int
    max_queue: int
    seed: int
    device: str
    dtype: DtypeChoice
    tensor_parallel_size: int
    debug_lockstep: bool
    collective_timeout: float
    step_cost: str | None

    @property
    def name(self) -> str:
        """The model name clients use."""
        return self.served_model_name or self.model

    def run(self) -> None:
        """Check every flag, resolve acceptance, check the engine's configuration, then serve;
        every refusal exits before a port is bound."""
        _server_flags(self.port, self.max_queue, self.api_key)
        _check_collective_timeout(self.collective_timeout)
        _check_k(self.num_speculative_tokens)
        spec_json = _speculative_json(self.speculative_config)
        workload = self._workload()
        spec = self._speculation(spec_json)
        resolution = self._resolution(spec, workload)
        spread = self._spread(spec, resolution)
        # The engine (and torch) load only once the command line is known to be well formed;
        # the server's modules load here too, so a Ctrl-C meanwhile is held, not swallowed.
        with interrupt_deferred():
            import uvicorn  # noqa: F401

            import speclens.server  # noqa: F401
            from speclens.engine.config import ModelLoadError
        config = self._engine_config(spec, spec_json, spread)
        if resolution is not None:
            _log_resolution(resolution)
        _warn_if_exposed(self.host, self.api_key)
        try:
            run_server(
                config, self.name, self.host, self.port, self.api_key, self.stats_level.value,
                self.max_queue, resolution, force_include_usage=self.force_include_usage,
                collective_timeout_s=self.collective_timeout,
            )  # fmt: skip
        except ModelLoadError as exc:  # what the headers could not show (a tensor, the tokenizer)
            fail(_model_refusal(exc, self.model))

    def _speculation(self, spec_json: dict[str, Any]) -> _Speculation:
        """The flags merged with ``--speculative-config`` (a contradiction exits 2)."""

        def merged(flag: Any, key: str, name: str) -> Any:
            return _merge(flag, key, spec_json, name)

        return _Speculation(
            method=merged(self.method, "method", "--method"),
            k=merged(
                self.num_speculative_tokens, "num_speculative_tokens", "--num-speculative-tokens"
            ),
            draft_model=merged(self.draft_model, "model", "--draft-model"),
            length=merged(
                self.acceptance_length,
                "synthetic_acceptance_length",
                "--spec-decode-acceptance-length",
            ),
            rate=merged(
                self.acceptance_rate, "synthetic_acceptance_rate", "--spec-decode-acceptance-rate"
            ),
            rates=spec_json.get("synthetic_acceptance_rates"),
        )

    def _workload(self) -> Any:
        """``--thinking`` and ``--category`` (checked even without a profile: exit 2)."""
        from speclens.acceptance import WorkloadAcceptance

        try:
            return validate(
                WorkloadAcceptance, {"thinking": self.thinking, "category": self.category}
            )
        except ValidationError as exc:
            fail((f"--{p.path}: {p.message}" for p in exc.problems), code=2)

    def _resolution(self, spec: _Speculation, workload: Any) -> Any:
        """``--acceptance-profile``'s resolution (its rates replace ``spec.rates``), or None."""
        from speclens.acceptance import AcceptancePin, resolve
        from speclens.cli._common import reported

        if self.acceptance_profile is None:
            return None
        if self.acceptance_spread is not None:
            fail(
                f"--spec-decode-acceptance-spread {self.acceptance_spread}: --acceptance-profile "
                "replays the profile's own spread (or none); give a spread file with "
                "--spec-decode-acceptance-length instead",
                code=2,
            )
        if spec.length is not None or spec.rate is not None or spec.rates is not None:
            fail(
                "--acceptance-profile replays the registry's value: do not also force a length or rate",
                code=2,
            )
        if not spec.method or not spec.k:
            fail(
                "--acceptance-profile needs --method and --num-speculative-tokens (the profile key)",
                code=2,
            )
        profile = self.acceptance_profile
        with reported():
            pin = None if profile == "registry" else AcceptancePin(profiles=profile)
            resolution = resolve(
                model=self.name, method=spec.method, num_spec_tokens=spec.k,
                hardware=self.hardware, registry=load_registry(self.registry),
                workload=workload, scenario=pin,
            )  # fmt: skip
        spec.rates = resolution.per_position_rates
        return resolution

    def _spread(self, spec: _Speculation, resolution: Any) -> Any:
        """The spread forced with the AL: ``--spec-decode-acceptance-spread``'s file, read and
        checked against K and the forced AL (each refusal exits 2 naming the file and field), or
        the resolved profile's own; None without either (``_resolution`` refuses the file beside
        a profile: a profile states its spread with its AL, or states none)."""
        path = self.acceptance_spread
        if path is None:
            return None if resolution is None else resolution.spread
        flag = f"--spec-decode-acceptance-spread {path}"
        if spec.length is None and spec.rate is None and spec.rates is None:
            fail(
                f"{flag}: expected a forced acceptance length (--spec-decode-acceptance-length or "
                "-rate, or --speculative-config's synthetic_acceptance_*): a spread spreads a "
                "forced AL between requests",
                code=2,
            )
        from speclens.acceptance import AcceptanceSpread, load
        from speclens.acceptance.spread import quantile_problems

        try:
            spread = load(AcceptanceSpread, path)
        except ValidationError as exc:
            fail((f"--spec-decode-acceptance-spread: {p}" for p in exc.problems), code=2)
        if spec.k and spread.num_spec_tokens != spec.k:
            fail(
                f"--spec-decode-acceptance-spread: {path}: num_spec_tokens: is "
                f"{spread.num_spec_tokens}, but --num-speculative-tokens is {spec.k}: a spread is "
                "refused at another K, never rescaled",
                code=2,
            )
        length = _forced_length(spec)
        if length is not None:
            problems = quantile_problems(spread.values, spec.k, length, spread.tolerance)
            if problems:  # the file's own checks passed: only the mean against the AL is left
                fail(f"--spec-decode-acceptance-spread: {path}: quantiles: {problems[0]}", code=2)
        return spread

    def _engine_config(
        self, spec: _Speculation, spec_json: dict[str, Any], spread: Any = None
    ) -> Any:
        """The checked ``EngineConfig`` (models' headers read too); a refusal exits 1."""
        from speclens.engine.config import (
            ConfigError,
            EngineConfig,
            ModelLoadError,
            SpeculativeConfig,
            StepCost,
        )
        from speclens.engine.weights import check_models, default_max_model_len

        cost = _step_cost(self.step_cost, StepCost)
        lookup_min, lookup_max = _prompt_lookup(
            spec_json, (SpeculativeConfig.ngram_min, SpeculativeConfig.ngram_max)
        )
        try:
            max_model_len = self.max_model_len
            if max_model_len is None:
                sim = self.executor.value == "sim"
                max_model_len = 2048 if sim else default_max_model_len(self.model)
            speculative = SpeculativeConfig(
                method=spec.method,
                num_speculative_tokens=spec.k or 0,
                acceptance_length=spec.length if spec.rates is None else None,
                acceptance_rate=spec.rate,
                acceptance_rates=spec.rates,
                confidence_schedule=self.confidence_schedule,
                draft_model=spec.draft_model,
                ngram_max=lookup_max,
                ngram_min=lookup_min,
                seed=self.seed,
                acceptance_spread=spread,
                draft_coverage=self.draft_coverage,
                spread_coverage=self.draft_coverage,
            )
            config = EngineConfig(
                model=self.model,
                speculative=speculative,
                executor=self.executor.value,
                max_num_seqs=self.max_num_seqs,
                max_model_len=max_model_len,
                max_num_batched_tokens=self.max_num_batched_tokens or max(8192, max_model_len),
                kv_cache_tokens=self.kv_cache_tokens,
                device=self.device,
                dtype=resolve_dtype(self.dtype.value, self.device),
                seed=self.seed,
                step_cost=cost,
                tensor_parallel_size=self.tensor_parallel_size,
                debug_lockstep=self.debug_lockstep,
            )
            config.validate()
            check_models(config)
            _check_parallel(config)
        except ModelLoadError as exc:
            fail(_model_refusal(exc, self.model))
        except ConfigError as exc:
            fail(f"refused: {exc}")
        return config


def _forced_length(spec: _Speculation) -> float | None:
    """The AL the flags force, or None where they do not resolve to one (the engine's own check
    then refuses them, naming the flag). Pure Python: torch is not loaded yet."""
    from speclens.acceptance import check_rates, length_from_rates

    k = spec.k or 0
    if k < 1:
        return None
    if spec.rates is not None:
        try:
            return length_from_rates(check_rates(spec.rates, k))
        except ValidationError:
            return None
    if spec.rate is not None:
        ok = math.isfinite(spec.rate) and 0.0 <= spec.rate <= 1.0
        return 1.0 + k * spec.rate if ok else None
    length = spec.length
    return length if length is not None and math.isfinite(length) and 1 <= length <= k + 1 else None


def _check_parallel(config: Any) -> None:
    """Refuse a tensor-parallel size the models or the machine cannot take, before any rank
    starts (``ConfigError``, one line)."""
    if config.tensor_parallel_size == 1:
        return
    from speclens.engine.config import ConfigError
    from speclens.engine.parallel import capacity_problem
    from speclens.engine.parallel_shard import shard_problem
    from speclens.engine.weights import model_config

    size = config.tensor_parallel_size
    names = [("--model", config.model)]
    draft = config.speculative.draft_model
    if config.speculative.method == "draft_model" and draft and not draft.startswith("layers:"):
        names.append(("--draft-model", draft))
    elif config.speculative.method == "draft_model" and draft is None and config.model == "dummy":
        names.append(("--draft-model", "dummy-draft"))
    for flag, name in names:
        problem = shard_problem(model_config(name), size, f"{flag} {name}")
        if problem is not None:
            raise ConfigError(problem)
    problem = capacity_problem(size, config.device)
    if problem is not None:
        raise ConfigError(problem)


def _log_resolution(resolution: Any) -> None:
    log.info(
        "Acceptance profile: %s from the %s layer (%s: %s, method %s); source: %s%s",
        f"{resolution.acceptance_length:g}", resolution.layer, resolution.profile_set,
        resolution.profile, resolution.method, resolution.source or "(none)",
        f"; measured on {resolution.measured_on}" if resolution.measured_on else "",
    )  # fmt: skip


def run_server(
    config: Any,
    served_model_name: str,
    host: str,
    port: int,
    api_key: str | None,
    stats_level: str,
    max_queue: int,
    resolution: Any = None,
    idle_timeout_s: float = 30.0,
    force_include_usage: bool = False,
    collective_timeout_s: float | None = None,
) -> None:
    """Bind, build the engine and app, then serve until SIGINT/SIGTERM (exit 0) or until the
    engine fails (exit 1, after its traceback is logged once)."""
    from speclens.server import build_engine
    from speclens.server.serving import bind

    try:
        sock = bind(host, port)
    except OSError as exc:
        fail(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}")
    from speclens.engine.config import ConfigError

    try:
        engine = build_engine(config, collective_timeout_s)
    except ConfigError as exc:  # a tensor-parallel rank that could not start
        fail(f"refused: {exc}")
    try:
        _serve_engine(engine, config, served_model_name, host, sock, api_key, stats_level,
                      max_queue, resolution, idle_timeout_s, force_include_usage)  # fmt: skip
    finally:
        engine.close()  # the other tensor-parallel ranks, if any


def _serve_engine(
    engine: Any,
    config: Any,
    served_model_name: str,
    host: str,
    sock: Any,
    api_key: str | None,
    stats_level: str,
    max_queue: int,
    resolution: Any,
    idle_timeout_s: float,
    force_include_usage: bool,
) -> None:
    """Serve a built engine on the bound socket until a signal or the engine's death."""
    from speclens.server import EngineRunner, ServerSettings, create_app
    from speclens.server.serving import serve
    from speclens.server.settings import acceptance_settings

    port = sock.getsockname()[1]
    settings = ServerSettings(
        served_model_name=served_model_name,
        api_key=api_key,
        stats_level=stats_level,  # type: ignore[arg-type]
        acceptance=acceptance_settings(config.speculative, resolution),
        max_n=max(1, min(16, config.max_num_seqs)),
        idle_timeout_s=idle_timeout_s,
        force_include_usage=force_include_usage,
    )
    runner = EngineRunner(engine, max_queue=max_queue)
    app = create_app(runner, settings)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it; exit 0 instead of dying by it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def listening() -> None:
        log.info(
            "speclens serving %s on http://%s:%d (executor %s, %s)",
            served_model_name, host, port, config.executor, config.dtype,
        )  # fmt: skip

    serve(app, runner, sock, idle_timeout_s, listening)
    if runner.error is not None:
        fail(f"{runner.error}; the server has shut down")
