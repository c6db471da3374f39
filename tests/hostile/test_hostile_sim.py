"""``speclens sim`` under scenarios it cannot or should not run: bounded work, stated limits
kept as written, and one-line refusals (exit 1 for the scenario, exit 2 for a flag) that come
before any simulation."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
import time
from itertools import islice, pairwise
from pathlib import Path

import pytest
import yaml

import launch
from childtime import Took, assert_quick, took

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kimi-k3-dspark.yaml"

SMALL = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 7}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 32,
                 "output_tokens": 32, "concurrency": 4, "requests": 8},
}  # fmt: skip


def _scenario(tmp_path: Path, **changes: object) -> Path:
    """SMALL with changes by path (``workload__requests=...``; ``pools`` means the first pool),
    written to a file."""
    data = copy.deepcopy(SMALL)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node: dict = data
        for key in parents:
            node = node[key][0] if key == "pools" else node[key]
        node[leaf] = value
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _sim(*args: object, timeout: float = 60) -> tuple[int, list[str], str, Took]:
    """``python -m speclens sim ARGS`` in a child (PYTHONPATH passes through); returns the exit
    code, stderr's lines, stdout and how long it took."""
    start = time.perf_counter()
    proc = launch.run(
        [sys.executable, "-m", "speclens", "sim", *map(str, args)],
        timeout=timeout,
        env={**os.environ, "COLUMNS": "400"},
    )
    seconds = took(proc, time.perf_counter() - start)
    return proc.returncode, proc.stderr.splitlines(), proc.stdout, seconds


#: Runs ``speclens`` and, at exit, writes its own peak resident memory (VmHWM, KiB) to argv[1],
#: and the CPU seconds it used after its imports.
#: VmHWM belongs to the process's address space since exec; ``ru_maxrss`` would not do: Linux
#: folds the forking parent's resident size into the child's at exec.
_MEASURED = """
import atexit, sys, time
out = sys.argv.pop(1)
def peak():
    with open("/proc/self/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(out, "w") as f:
        f.write(f"{kib} {time.process_time() - cpu}")
atexit.register(peak)
from speclens.cli import main
cpu = time.process_time()
main()
"""


def _sim_measured(*args: object, timeout: float) -> tuple[int, list[str], str, Took, int]:
    """``_sim`` in a fresh interpreter, plus its own peak resident memory in KiB (a child forked
    by the warm start-up server would count its parent's pages too)."""
    with tempfile.TemporaryDirectory() as tmp:
        peak = Path(tmp) / "peak"
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", _MEASURED, str(peak), "sim", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "COLUMNS": "400"},
        )
        seconds = time.perf_counter() - start
        kib, cpu_s = peak.read_text().split()
        return (
            proc.returncode,
            proc.stderr.splitlines(),
            proc.stdout,
            Took(seconds, float(cpu_s)),
            int(kib),
        )


# ------------------------------------------------------------------------------ item 2: bounds
@pytest.mark.timeout(30)
def test_a_billion_requests_is_refused_at_once_in_bounded_memory(tmp_path: Path) -> None:
    path = _scenario(tmp_path, workload__requests=10**9)
    code, err, _, seconds, peak_kib = _sim_measured(path, timeout=10)
    assert code == 1
    assert err == [
        f"{path}: workload.requests: 1,000,000,000 requests x up to 32 output tokens "
        "(workload.output_tokens) = 32,000,000,000 request-steps, over the budget of "
        "1,000,000,000: lower workload.requests or workload.output_tokens, or raise "
        "--max-request-steps",
    ]  # the fast path keeps no prompt: tests/hostile/test_hostile_sim_prompt_bound.py
    assert_quick(seconds, 1.5)
    assert peak_kib < 600 * 1024  # nothing was built per request


@pytest.mark.timeout(60)
def test_a_million_replicas_is_refused(tmp_path: Path) -> None:
    path = _scenario(tmp_path, deployment__pools__replicas=10**6)
    code, err, _, seconds = _sim(path, timeout=30)
    assert (code, err) == (1, [
        f"{path}: deployment.pools[0].replicas: 1,000,000 simulated replicas in all, over the "
        "limit of 1,024 (one engine each): simulate fewer replicas and scale the throughput"
    ])  # fmt: skip
    assert_quick(seconds, 4.5)


@pytest.mark.timeout(60)
def test_a_hundred_million_output_tokens_is_refused(tmp_path: Path) -> None:
    path = _scenario(tmp_path, workload__output_tokens=10**8, workload__requests=1)
    code, err, _, seconds = _sim(path, "--exact", timeout=30)  # the step-exact loop's budget
    assert (code, err) == (1, [
        f"{path}: deployment.pools[0].engine.max_model_len: is 32768, but a request may need "
        "100000032 tokens (workload.input_tokens up to 32 + workload.output_tokens up to "
        "100000000): raise max_model_len or shorten the workload",
        f"{path}: workload.requests: 1 requests x up to 100,000,000 output tokens "
        "(workload.output_tokens) = 100,000,000 request-steps, over the budget of 10,000,000: "
        "lower workload.requests or workload.output_tokens, or raise --max-request-steps",
    ])  # fmt: skip
    assert_quick(seconds, 4.5)


@pytest.mark.timeout(60)
def test_the_budget_flag_sets_the_bound(tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    code, err, _, _ = _sim(path, "--max-request-steps", 100, timeout=30)
    assert (code, err) == (1, [
        f"{path}: workload.requests: 8 requests x up to 32 output tokens "
        "(workload.output_tokens) = 256 request-steps, over the budget of 100: lower "
        "workload.requests or workload.output_tokens, or raise --max-request-steps"
    ])  # fmt: skip
    code, err, _, _ = _sim(path, "--max-request-steps", 0, timeout=30)
    assert (code, err) == (2, ["--max-request-steps: expected an integer >= 1, got 0"])


@pytest.mark.timeout(60)
def test_a_short_max_model_len_is_refused_not_raised(tmp_path: Path) -> None:
    path = _scenario(tmp_path, deployment__pools__engine__max_model_len=60)
    code, err, out, _ = _sim(path, "--json", timeout=30)
    assert (code, err, out) == (1, [
        f"{path}: deployment.pools[0].engine.max_model_len: is 60, but a request may need 64 "
        "tokens (workload.input_tokens up to 32 + workload.output_tokens up to 32): raise "
        "max_model_len or shorten the workload"
    ], "")  # fmt: skip


@pytest.mark.timeout(60)
def test_a_small_kv_cache_is_refused_not_raised(tmp_path: Path) -> None:
    path = _scenario(tmp_path, deployment__pools__engine__kv_cache_tokens=10)
    code, err, out, _ = _sim(path, "--json", timeout=30)
    assert (code, err, out) == (1, [
        f"{path}: deployment.pools[0].engine.kv_cache_tokens: is 10, but one request of "
        "deployment.pools[0].engine.max_model_len 32768 plus its 8 verify slots needs 32776: "
        "raise kv_cache_tokens or lower max_model_len"
    ], "")  # fmt: skip


def test_the_library_refuses_what_the_command_refuses() -> None:
    from speclens.acceptance import ValidationError, minimum_variance_rates
    from speclens.sim.scenario import Scenario
    from speclens.sim.simulate import simulate

    data = copy.deepcopy(SMALL)
    data["deployment"]["pools"][0]["engine"]["max_model_len"] = 60
    with pytest.raises(ValidationError) as info:
        simulate(Scenario.model_validate(data), Path("."), minimum_variance_rates(3.0, 7))
    assert [p.path for p in info.value.problems] == ["deployment.pools[0].engine.max_model_len"]


def test_limits_that_just_fit_run_as_stated() -> None:
    """Guard (passes on the old code too): a workload that exactly fits its pool's stated
    max_model_len and KV cache runs, so the refusals above are not over-strict."""
    from speclens.acceptance import minimum_variance_rates
    from speclens.sim.scenario import Scenario
    from speclens.sim.simulate import simulate

    data = copy.deepcopy(SMALL)
    data["deployment"]["pools"][0]["engine"].update(max_model_len=64, kv_cache_tokens=64 + 8)
    result = simulate(Scenario.model_validate(data), Path("."), minimum_variance_rates(3.0, 7))
    assert result["pools"]["0"]["requests"] == 8
    assert result["latency_ms"]["e2e"] is not None


@pytest.mark.timeout(30)
def test_arrivals_are_drawn_lazily() -> None:
    """A replica takes its share of a stream drawn a chunk at a time: the first of a billion
    requests comes at once, and the shares of all replicas are the whole stream in order."""
    from speclens.sim.scenario import Workload
    from speclens.sim.simulate import CHUNK, arrivals

    start = time.perf_counter()
    first = next(arrivals(Workload(requests=10**9, rate=5.0), seed=0))
    assert first.index == 0 and time.perf_counter() - start < 1.0
    workload = Workload(requests=CHUNK + 7, rate=50.0, input_tokens={"min": 1, "max": 9})
    whole = [(r.index, r.arrival, r.input_tokens) for r in arrivals(workload, 3)]
    shares = [
        (r.index, r.arrival, r.input_tokens) for s in range(3) for r in arrivals(workload, 3, s, 3)
    ]
    assert sorted(shares) == whole
    assert [r.index for r in islice(arrivals(workload, 3, 2, 5), 3)] == [2, 7, 12]
    assert all(a[1] <= b[1] for a, b in pairwise(whole))


@pytest.mark.timeout(60)
def test_a_huge_k_is_refused(tmp_path: Path) -> None:
    path = _scenario(
        tmp_path,
        deployment__pools__engine__speculative={"method": "dspark", "num_spec_tokens": 10**8},
    )
    code, err, _, seconds = _sim(path, "--acceptance-length", "2.0", timeout=30)
    assert (code, err) == (1, [
        f"{path}: deployment.pools[0].engine.speculative.num_spec_tokens: must be at most 64, "
        "got 100000000"
    ])  # fmt: skip
    assert_quick(seconds, 4.5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("concurrency=1..1000000000", "--sweep: 1..1000000000 is over the limit of 64 points"),
        ("num_spec_tokens=1,100000", "--sweep: num_spec_tokens up to 64, got 100000"),
    ],
)
def test_a_sweep_is_bounded(tmp_path: Path, sweep: str, message: str) -> None:
    code, err, out, seconds = _sim(_scenario(tmp_path), "--sweep", sweep, timeout=30)
    assert (code, err, out) == (2, [message], "")
    assert_quick(seconds, 4.5)


@pytest.mark.timeout(60)
def test_a_sweep_shares_the_budget(tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    code, err, _, _ = _sim(path, "--sweep", "concurrency=1..4", "--max-request-steps", 1000)
    assert (code, err) == (1, [
        f"{path}: workload.requests: 8 requests x up to 32 output tokens "
        "(workload.output_tokens) x 4 sweep points = 1,024 request-steps, over the budget of "
        "1,000: lower workload.requests or workload.output_tokens, or raise --max-request-steps"
    ])  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("rate", "burstiness", "path", "message"),
    [
        (1e-200, 1e-200, "workload.burstiness", "is 1e-200 with workload.rate 1e-200: expected a "
         "finite burstiness whose product with the rate is above zero"),
        (1e-307, 1.0, "workload.rate", "is 1e-307: 8 arrivals at this rate and burstiness 1 "
         "overflow the clock; raise the rate"),
    ],
)  # fmt: skip
def test_an_arrival_stream_that_overflows_is_refused(
    tmp_path: Path, rate: float, burstiness: float, path: str, message: str
) -> None:
    scenario = _scenario(tmp_path, workload__concurrency=None, workload__rate=rate,
                         workload__burstiness=burstiness)  # fmt: skip
    code, err, _, _ = _sim(scenario, timeout=30)
    assert (code, err) == (1, [f"{scenario}: {path}: {message}"])


# ------------------------------------------------------------------------- item 10: edge cases
@pytest.mark.timeout(60)
@pytest.mark.parametrize("field", ["input_tokens", "output_tokens"])
def test_min_above_max_is_a_validation_error(tmp_path: Path, field: str) -> None:
    path = _scenario(tmp_path, **{f"workload__{field}": {"min": 1024, "max": 256}})
    code, err, _, _ = _sim(path, timeout=30)
    assert (code, err) == (1, [f"{path}: workload.{field}: min 1024 > max 256"])


@pytest.mark.timeout(60)
def test_a_negative_seed_is_a_usage_error(tmp_path: Path) -> None:
    code, err, out, _ = _sim(_scenario(tmp_path), "--seed", "-1", timeout=30)
    assert (code, err, out) == (2, ["--seed: expected an integer in 0..4294967295, got -1"], "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["missing-dir", "a-directory"])
def test_an_unwritable_plot_is_refused_before_simulating(tmp_path: Path, where: str) -> None:
    path = _scenario(tmp_path)
    plot = tmp_path / "nowhere" / "sweep.png" if where == "missing-dir" else tmp_path
    code, err, out, _ = _sim(path, "--sweep", "num_spec_tokens=1..2", "--plot", plot, timeout=30)
    expected = (
        f"--plot: {plot}: directory {plot.parent} does not exist"
        if where == "missing-dir"
        else f"--plot: {plot}: is a directory, expected a file to write"
    )
    assert (code, err, out) == (2, [expected], "")


@pytest.mark.timeout(60)
def test_plot_without_sweep_is_refused(tmp_path: Path) -> None:
    plot = tmp_path / "plot.png"
    code, err, out, _ = _sim(_scenario(tmp_path), "--plot", plot, timeout=30)
    assert (code, err, out) == (
        2,
        ["--plot needs --sweep: it draws throughput against latency across the points"],
        "",
    )
    assert not plot.exists()


# ------------------------------------------------------------------------ unchanged results
#: The step cost the shipped example stated by hand before it was priced by the catalog.
EXAMPLE_STEP_COST = {"base": 0.012, "per_token": 0.00002, "per_seq": 0.00005,
                     "per_context_token": 0.00000001, "draft_base": 0.0008,
                     "draft_per_token": 0.000004}  # fmt: skip


def test_the_example_gives_the_numbers_it_gave_before(tmp_path: Path) -> None:
    """Guard (passes on the old code too): lazy arrivals, per-request tallies and the KV bound
    change nothing for a scenario within the limits (numbers from the code before them, for
    the example with the step cost it then stated; since moved on purpose once, when a
    closed loop's next request came to wait for the step begun as it arrived: makespan
    24.4614 s to 24.5378 s, throughput 3432.18 to 3421.50 tokens/s)."""
    from speclens.acceptance import minimum_variance_rates
    from speclens.sim.scenario import load_scenario
    from speclens.sim.simulate import simulate

    data = yaml.safe_load(EXAMPLE.read_text())
    data["deployment"]["pools"][0]["step_cost"] = EXAMPLE_STEP_COST
    data["workload"]["requests"] = 256  # the example's request count when these were taken
    path = tmp_path / "example.yaml"
    path.write_text(yaml.safe_dump(data))
    result = simulate(load_scenario(path), tmp_path, minimum_variance_rates(3.78, 7))
    assert result["realized_acceptance_length"] == pytest.approx(3.7853379565002028, rel=1e-12)
    assert result["makespan_s"] == pytest.approx(24.53778555999998, rel=1e-9)
    assert result["throughput"]["output_tokens_per_s"] == pytest.approx(
        3421.4986431725943, rel=1e-9
    )


# ----------------------------------------------------------------- step costs that cannot price
@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_an_infinite_step_cost_is_refused(tmp_path: Path, value: str) -> None:
    """A price of ``.inf`` (or NaN) is refused as ``serve --step-cost`` refuses it, naming the
    field: before, ``.inf`` printed a makespan of 1e-12 s and 8e12 requests a second, exit 0."""
    path = _scenario(tmp_path, deployment__pools__step_cost={"base": 1.0})
    path.write_text(path.read_text().replace("base: 1.0", f"base: {value}"))
    code, err, out, _ = _sim(path, "--json", timeout=30)
    shown = {".inf": "inf", "-.inf": "-inf", ".nan": "nan"}[value]
    assert (code, err, out) == (1, [
        f"{path}: deployment.pools[0].step_cost.base: expected a finite number >= 0 (seconds), "
        f"got {shown}"
    ], "")  # fmt: skip


@pytest.mark.timeout(60)
def test_an_infinite_step_cost_in_a_step_cost_file_is_refused(tmp_path: Path) -> None:
    path = _scenario(tmp_path, deployment__pools__step_cost_file="cost.yaml")
    cost = tmp_path / "cost.yaml"
    cost.write_text("per_seq: .inf\n")
    code, err, out, _ = _sim(path, "--json", timeout=30)
    assert code == 1 and out == ""
    assert len(err) == 1 and err[0].endswith(
        "cost.yaml: per_seq: expected a finite number >= 0 (seconds), got inf"
    ), err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("exact", [False, True])
def test_a_step_cost_that_overflows_the_clock_is_refused(tmp_path: Path, exact: bool) -> None:
    """``base: 1e308`` is finite, but two steps of it overflow: before, the run printed
    makespan 1e-12 and numpy's overflow warnings, exit 0. Now it is refused before any step,
    naming the pool's step cost; nothing is printed on stdout."""
    path = _scenario(tmp_path, deployment__pools__step_cost={"base": 1e308})
    code, err, out, _ = _sim(path, "--json", *(["--exact"] if exact else []), timeout=30)
    assert (code, out) == (1, "")
    assert err == [
        f"{path}: deployment.pools[0].step_cost: prices a step at up to 1e+308 s, and the run "
        "may take 256 steps: the clock would overflow (past 1e+300 s); expected prices in "
        "seconds"
    ]


@pytest.mark.timeout(60)
def test_an_all_zero_step_cost_is_refused(tmp_path: Path) -> None:
    """Every price 0: the clock never moves. Before, the run printed makespan 1e-12 s and
    2.56e14 output tokens a second, exit 0."""
    zero = dict.fromkeys(
        ("base", "per_token", "per_seq", "per_context_token", "draft_base", "draft_per_token"), 0
    )
    path = _scenario(tmp_path, deployment__pools__step_cost=zero)
    code, err, out, _ = _sim(path, "--json", timeout=30)
    assert (code, out) == (1, "")
    assert err == [
        f"{path}: deployment.pools[0].step_cost: prices a decode step at 0 s (base, per_token, "
        "per_seq and per_context_token are all 0): expected a positive price, or the clock "
        "never moves"
    ]


def test_a_run_of_zero_seconds_is_refused_not_printed() -> None:
    """Decode priced, prefill free, every request one token (done at its prefill): the run
    takes 0 s of virtual time, and no throughput can be computed from it."""
    from speclens.acceptance import ValidationError, minimum_variance_rates
    from speclens.sim.scenario import Scenario
    from speclens.sim.simulate import simulate

    data = copy.deepcopy(SMALL)
    data["workload"].update(output_tokens=1)
    data["deployment"]["pools"][0]["step_cost"] = {"prefill_base": 0.0, "prefill_per_token": 0.0}
    for fast in (False, True):
        with pytest.raises(ValidationError) as info:
            simulate(
                Scenario.model_validate(data), Path("."), minimum_variance_rates(3.0, 7),
                source="s.yaml", fast=fast,
            )  # fmt: skip
        assert [str(p) for p in info.value.problems] == [
            "s.yaml: deployment.pools: the run took 0 s of virtual time (every step it ran was "
            "priced at 0 s): no throughput can be computed; price the steps (step_cost)"
        ]


# ------------------------------------------------------------------------------ the catalog
@pytest.mark.timeout(60)
def test_a_chip_with_a_negative_bandwidth_is_refused_in_one_line(tmp_path: Path) -> None:
    """A chip file (as ``calibrate --host`` writes one) with a negative memory bandwidth would
    price every step at a negative time: refused, naming the file and the field."""
    chip = tmp_path / "chip.yaml"
    chip.write_text(
        "kind: Chip\nname: mine\nsource: measured\ntflops: {bf16: 1.0}\nmemory_gb: 64\n"
        "memory_bandwidth_tbps: -0.05\ninterconnect_gbps: 10\n"
    )
    path = _scenario(tmp_path, hardware_file="chip.yaml")
    path.write_text(path.read_text().replace("model: kimi-k3", "model: smollm2-135m"))
    code, err, out, _ = _sim(path, "--acceptance-length", "2.0", timeout=30)
    assert (code, err, out) == (1, [
        f"{chip}: memory_bandwidth_tbps: Input should be greater than 0 (got a number (-0.05))"
    ], "")  # fmt: skip


@pytest.mark.timeout(60)
def test_a_chip_file_outside_the_scenario_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "scenario"
    folder.mkdir()
    path = _scenario(folder, hardware_file="../chip.yaml")
    code, err, _, _ = _sim(path, "--acceptance-length", "2.0", timeout=30)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"{folder / '../chip.yaml'}: hardware_file: leaves its folder"), err
