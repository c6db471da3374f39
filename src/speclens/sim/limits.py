"""What ``speclens sim`` agrees to simulate: a scenario's stated limits hold as written, and a
run's work is bounded before any of it starts.

The checks are arithmetic on the scenario (no draws, no engine), so a refusal is immediate.
Each problem reads ``<file>: <path.to.field>: <what is wrong>``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from speclens.acceptance import MAX_NUM_SPEC_TOKENS as _MAX_K
from speclens.acceptance import Problem, ValidationError
from speclens.cost import Pricing
from speclens.runs.record import MAX_SECONDS
from speclens.sim.run_output import MAX_RECORDED_REQUEST_STEPS
from speclens.sim.scenario import Lengths, Pool, Scenario, pool_cost

if TYPE_CHECKING:
    from speclens.runs.trace import Trace

#: Most request-steps a run may take, estimated as requests x the longest output (every step
#: of a request emits at least one token). The simulator prices about 20-200k request-steps a
#: second and keeps 8 bytes a token for the latency percentiles, so this default is minutes
#: and well under a GiB. ``speclens sim --max-request-steps`` raises it.
MAX_REQUEST_STEPS = 10_000_000
#: The same budget for the event-level fast path (``speclens.sim.fast``), which prices a few
#: million request-steps a second and keeps constant memory (latency sketches, a window of
#: decode steps, at most about a million drawn request-steps), so this default is minutes too.
MAX_FAST_REQUEST_STEPS = 1_000_000_000
#: Most prompt tokens a run that keeps every request may hold (the step-exact loop, or a run
#: that writes its records): requests x the longest input. Its engine holds a queued request's
#: prompt (8 bytes a token), and an open-loop workload over capacity can queue every request.
#: The fast path keeps a prompt as its length and a finished request as sketch samples, so
#: its request-step budget bounds it instead.
MAX_PROMPT_TOKENS = 200_000_000
#: Largest K simulated: the one bound speclens has (``speclens.acceptance.MAX_NUM_SPEC_TOKENS``).
MAX_NUM_SPEC_TOKENS = _MAX_K
#: Most points one ``--sweep`` runs (each is a whole simulation, counted in the budget).
MAX_SWEEP_POINTS = 64
#: Most simulated replicas (the sum over the pools that decode): each runs its own engine and
#: re-draws the arrival stream to take its share, so set-up and draws grow with the count.
MAX_REPLICAS = 1024
#: Latest virtual time a run may reach, in seconds: far from float overflow (about 1.8e308), so
#: no sum of prices and arrival gaps (each bounded by it) turns into inf or NaN.
MAX_CLOCK_S = 1e300


def longest(spec: int | Lengths) -> int:
    """The most tokens a length spec can draw."""
    return spec if isinstance(spec, int) else spec.max


def batched_tokens(pool: Pool) -> int:
    """The token budget of a step the simulator gives a pool's engine
    (``EngineConfig.max_num_batched_tokens``): a whole prompt at its longest, 8192 at least."""
    return max(pool.engine.max_model_len, 8192)


def simulated_pools(scenario: Scenario) -> list[tuple[int, Pool]]:
    """The pools whose replicas run an engine in the stepped loops: those that decode (a
    scenario with a prefill pool is disaggregated and solved in its steady state instead:
    ``sim/disagg_run.py``), or the first pool when every pool only prefills."""
    pools = [(i, p) for i, p in enumerate(scenario.deployment.pools) if p.role != "prefill"]
    return pools or [(0, scenario.deployment.pools[0])]


def problems(
    scenario: Scenario,
    file: str,
    num_spec_tokens: Iterable[int | None] = (None,),
    max_request_steps: int = MAX_REQUEST_STEPS,
    runs: int = 1,
    keeps_requests: bool = True,
) -> list[Problem]:
    """Everything that stops the scenario from being simulated as stated. ``num_spec_tokens``
    lists the K values a sweep will run (None: each pool's own K); ``runs`` simulations of the
    scenario (a sweep's points) share the request-step budget; ``keeps_requests``: the run may
    hold every request whole (the step-exact loop, or records kept), so its prompt tokens are
    bounded (``MAX_PROMPT_TOKENS``)."""
    workload = scenario.workload
    out: list[Problem] = []
    inputs, outputs = longest(workload.input_tokens), longest(workload.output_tokens)
    sweep_ks = [k for k in num_spec_tokens if k is not None]
    pools = simulated_pools(scenario)
    for index, pool in pools:
        where = f"deployment.pools[{index}].engine"
        engine = pool.engine
        if inputs + outputs > engine.max_model_len:
            out.append(Problem(file, f"{where}.max_model_len", (
                f"is {engine.max_model_len}, but a request may need {inputs + outputs} tokens "
                f"(workload.input_tokens up to {inputs} + workload.output_tokens up to "
                f"{outputs}): raise max_model_len or shorten the workload"
            )))  # fmt: skip
        if engine.speculative is None:
            k = 0
        else:
            k = max(sweep_ks, default=engine.speculative.num_spec_tokens)
            if engine.speculative.num_spec_tokens > MAX_NUM_SPEC_TOKENS:
                out.append(Problem(file, f"{where}.speculative.num_spec_tokens", (
                    f"is {engine.speculative.num_spec_tokens}, over the limit of "
                    f"{MAX_NUM_SPEC_TOKENS} the simulator runs"
                )))  # fmt: skip
                continue
        if engine.kv_cache_tokens < engine.max_model_len + k + 1:
            out.append(Problem(file, f"{where}.kv_cache_tokens", (
                f"is {engine.kv_cache_tokens}, but one request of {where}.max_model_len "
                f"{engine.max_model_len} plus its {k + 1} verify slots needs "
                f"{engine.max_model_len + k + 1}: raise kv_cache_tokens or lower max_model_len"
            )))  # fmt: skip
    if workload.rate is not None:
        scale = workload.rate * workload.burstiness  # gaps are gamma(burstiness, 1 / scale)
        if not (math.isfinite(workload.burstiness) and scale > 0):
            out.append(Problem(file, "workload.burstiness", (
                f"is {workload.burstiness:g} with workload.rate {workload.rate:g}: expected a "
                "finite burstiness whose product with the rate is above zero"
            )))  # fmt: skip
        elif workload.requests / scale > 1e300:  # far from float overflow, whatever the draws
            out.append(Problem(file, "workload.rate", (
                f"is {workload.rate:g}: {workload.requests:,} arrivals at this rate and "
                f"burstiness {workload.burstiness:g} overflow the clock; raise the rate"
            )))  # fmt: skip
    replicas = sum(pool.replicas for _, pool in pools)
    if replicas > MAX_REPLICAS:
        index = max(pools, key=lambda ip: ip[1].replicas)[0]
        out.append(Problem(file, f"deployment.pools[{index}].replicas", (
            f"{replicas:,} simulated replicas in all, over the limit of {MAX_REPLICAS:,} "
            "(one engine each): simulate fewer replicas and scale the throughput"
        )))  # fmt: skip
    steps = workload.requests * outputs * runs
    if steps > max_request_steps:
        sweep = f" x {runs} sweep points" if runs > 1 else ""
        out.append(Problem(file, "workload.requests", (
            f"{workload.requests:,} requests x up to {outputs:,} output tokens "
            f"(workload.output_tokens){sweep} = {steps:,} request-steps, over the budget of "
            f"{max_request_steps:,}: lower workload.requests or workload.output_tokens, "
            "or raise --max-request-steps"
        )))  # fmt: skip
    prompts = workload.requests * inputs
    if keeps_requests and prompts > MAX_PROMPT_TOKENS:
        out.append(Problem(file, "workload.input_tokens", (
            f"{workload.requests:,} requests (workload.requests) x up to {inputs:,} input "
            f"tokens = {prompts:,} prompt tokens, over the limit of {MAX_PROMPT_TOKENS:,}: "
            "lower workload.requests or workload.input_tokens"
        )))  # fmt: skip
    return out


def cost_problems(
    scenario: Scenario, file: str, base: Path, num_spec_tokens: Iterable[int | None] = (None,)
) -> list[Problem]:
    """Each simulated pool's step cost (inline or from its file, which must be valid) must
    move the clock, and the dearest step times the most steps the run can take must stay far
    from overflow: otherwise every figure would be computed from 0, inf or NaN."""
    out: list[Problem] = []
    workload = scenario.workload
    sweep_ks = [k for k in num_spec_tokens if k is not None]
    inputs, outputs = longest(workload.input_tokens), longest(workload.output_tokens)
    for index, pool in simulated_pools(scenario):
        cost = pool_cost(pool, base, scenario, file, index)
        field = "step_cost_file" if pool.step_cost_file is not None else "step_cost"
        where = f"deployment.pools[{index}].{field}"
        if cost.verify(1, 1, 1) <= 0:
            out.append(Problem(file, where, (
                "prices a decode step at 0 s (base, per_token, per_seq and per_context_token "
                "are all 0): expected a positive price, or the clock never moves"
            )))  # fmt: skip
            continue
        spec = pool.engine.speculative
        k = 0 if spec is None else max(sweep_ks, default=spec.num_spec_tokens)
        dearest = _dearest_step(cost, pool, k, inputs + outputs, workload.requests)
        steps = workload.requests * outputs  # each step emits a token for each of its requests
        if not (math.isfinite(dearest) and dearest * steps <= MAX_CLOCK_S):
            out.append(Problem(file, where, (
                f"prices a step at up to {dearest:g} s, and the run may take {steps:,} steps: "
                f"the clock would overflow (past {MAX_CLOCK_S:g} s); expected prices in seconds"
            )))  # fmt: skip
    return out


def _dearest_step(cost: Pricing, pool: Pool, k: int, tokens: int, requests: int) -> float:
    """The most a step of ``pool`` can cost: its most requests, each at its longest and
    drafting (a decode step), or a prefill of its whole token budget."""
    engine = pool.engine
    seqs = max(1, min(engine.max_num_seqs, requests))
    budget = batched_tokens(pool)
    decode = cost.decode(seqs * (k + 1), seqs, seqs * (tokens + k), seqs, k)
    return float(max(decode, cost.prefill(budget, seqs, budget)))


def check(
    scenario: Scenario,
    file: str,
    num_spec_tokens: Iterable[int | None] = (None,),
    max_request_steps: int = MAX_REQUEST_STEPS,
    runs: int = 1,
    base: Path | None = None,
    keeps_requests: bool = True,
) -> None:
    """Raise ``ValidationError`` with every problem ``problems`` finds, and, given the folder
    ``base`` that a ``step_cost_file`` is read from, every one ``cost_problems`` finds."""
    found = problems(scenario, file, num_spec_tokens, max_request_steps, runs, keeps_requests)
    if base is not None:
        found += cost_problems(scenario, file, base, num_spec_tokens)
    if found:
        raise ValidationError(found)


def trace_problems(trace: Trace, cost: Pricing, k: int, priced_by: str) -> list[str]:
    """What stops ``sim --trace`` from replaying ``trace`` (one line each), checked before any
    of it runs: its request-steps (every decode step emits a token, so at most its output
    tokens), which the replay keeps step by step for its records, within the budget of a run
    that keeps them (``run_output.MAX_RECORDED_REQUEST_STEPS``, as ``sim --output-dir``); and
    its cheapest step (one request, one token of context) priced by ``priced_by``
    (``<file>: <field>``) within a year, the longest time a run's records hold. A price grows
    with the batch at most as its tokens do, so with both bounds the clock stays finite; the
    replay's own span is checked against a year when it ends."""
    file = trace.source / "records.jsonl" if trace.kind == "run" else trace.source
    field = "completion_tokens" if trace.kind == "run" else "output_length"
    outputs = sum(r.output_tokens for r in trace.requests)
    if outputs > MAX_RECORDED_REQUEST_STEPS:
        return [f"{file}: {field}: {len(trace.requests):,} requests ask for {outputs:,} output "
                f"tokens in all, up to as many request-steps, over the "
                f"{MAX_RECORDED_REQUEST_STEPS:,} a replay may take (it keeps every request's "
                "decode steps for its records, as sim --output-dir does): replay fewer or "
                "shorter requests"]  # fmt: skip
    cheapest = float(min(cost.decode(1, 1, 1, 0, k), cost.prefill(1, 1, 1)))
    if not (math.isfinite(cheapest) and cheapest <= MAX_SECONDS):
        return [f"{priced_by}: prices a step at {cheapest:g} s at least: expected prices in "
                f"seconds (a replay's records hold at most a year, {MAX_SECONDS:g} s)"]  # fmt: skip
    return []
