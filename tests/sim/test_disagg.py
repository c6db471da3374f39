"""A disaggregated deployment's steady state (``speclens.sim.disagg``), held to arithmetic worked
out here: each pool priced by a stand-in whose step prices are written out (a decode step of b
requests costs 10 ms + 2 ms·b; a prefill step 1 ms a prompt), so every figure follows by hand
from the closed loop's identities (Little's law over the client's cycle; the prefill pool's
capacity; the KV bytes over the link)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from speclens.sim import disagg
from speclens.sim.closed_loop import Load
from speclens.sim.disagg import OverloadedError, Pools


@dataclass(frozen=True)
class Stand:
    """A worker's prices: decode ``base + per_request·b`` a step (the drafter free), prefill
    ``per_prompt`` a prompt; ``kv`` bytes a token; ``held`` tokens of KV cache."""

    base: float = 0.010
    per_request: float = 0.002
    per_prompt: float = 0.001
    kv: float = 1e6
    held: int = 10**9
    parallel: int = 4
    chip: Any = field(default_factory=lambda: SimpleNamespace(
        interconnect_gbps=1000.0, scale_up_domain=8, scale_out_gbps=100.0))  # fmt: skip
    efficiency: Any = field(default_factory=lambda: SimpleNamespace(interconnect=1.0))

    def decode(self, q: float, r: float, c: float, d: float, k: int) -> float:
        return self.base + self.per_request * r

    def prefill(self, tokens: float, requests: float, context: float) -> float:
        return self.per_prompt * requests

    def kv_bytes_per_token(self) -> float:
        return self.kv

    def kv_tokens(self) -> int:
        return self.held


def _pools(prefill: Stand | None = None, decode: Stand | None = None, workers: tuple[int, int]
           = (1, 2)) -> Pools:  # fmt: skip
    p, d = prefill or Stand(parallel=2), decode or Stand(parallel=2)
    return Pools(p, d, *workers)  # type: ignore[arg-type]


# 1024-token prompts, 101-token outputs (100 decode steps at AL 1), lengths fixed by a spread
# of 1 (the benchmark's range ratio leaves [0.8 L, L]: 819..1024 and 80..101).
LOAD = Load(8, 1024, 101)


def _by_hand_mean(load: Load) -> tuple[np.ndarray, np.ndarray]:
    from speclens.sim.closed_loop import lengths

    return lengths(load)


def test_little_law_holds_over_the_clients_cycle() -> None:
    """c clients, each cycling TTFT + decode: throughput X = c / (TTFT + T_dec), and the decode
    batch a worker holds is X·T_dec / W_d, both at the solved state."""
    pools = _pools()
    inputs, outputs = _by_hand_mean(LOAD)
    state = disagg.steady(LOAD, pools, 0.05, inputs, outputs)
    steps = float(np.ceil(outputs - 1).mean())
    dec = steps * (0.010 + 0.002 * max(state.batch, 1))
    assert state.step_s == pytest.approx(0.010 + 0.002 * max(state.batch, 1), rel=1e-12)
    assert state.requests_per_s * (state.ttft_s + dec) == pytest.approx(8, rel=1e-6)
    assert state.batch == pytest.approx(state.requests_per_s * dec / 2, rel=1e-6)
    assert state.bound == "decode"


def test_ttft_is_front_prefill_wait_and_the_kv_transfer() -> None:
    """The TTFT by hand: front + one prompt's prefill + the batch's growth with the load + half
    a busy step's wait + the prompt's KV over the link (both pools, 4 GPUs, inside the 8-GPU
    scale-up domain: 1000 GB/s a GPU, two lanes in parallel)."""
    pools = _pools()
    inputs, outputs = _by_hand_mean(LOAD)
    state = disagg.steady(LOAD, pools, 0.05, inputs, outputs)
    mean_in = float(inputs.mean())
    m = min(16384 // round(mean_in), 8)
    full, one = 0.001 * m, 0.001
    rho = state.requests_per_s / (m / full)
    transfer = mean_in * 1e6 / (2 * 1000e9)
    by_hand = 0.05 + one + (full - one) * rho + full * rho / 2 + transfer
    assert state.ttft_s == pytest.approx(by_hand, rel=1e-6)  # the root's own precision


def test_past_the_scale_up_domain_the_kv_moves_over_scale_out() -> None:
    """Pools of 12 GPUs outgrow the 8-GPU domain: the transfer runs at 100 GB/s a lane, not
    1000, and the TTFT grows by exactly that difference."""
    inputs, outputs = _by_hand_mean(LOAD)
    near = disagg.steady(LOAD, _pools(workers=(1, 1)), 0.0, inputs, outputs)  # 4 GPUs
    far_pools = _pools(workers=(1, 5))  # 2 + 10 GPUs
    assert far_pools.gpus == 12
    far = disagg.steady(LOAD, far_pools, 0.0, inputs, outputs)
    mean_in = float(inputs.mean())
    assert far_pools.link_bytes_per_s() == pytest.approx(2 * 100e9)
    slow = mean_in * 1e6 / (2 * 100e9) - mean_in * 1e6 / (2 * 1000e9)
    # the rest of the TTFT (prefill and its queue) differs only through the load it carries
    rest_near = near.ttft_s - mean_in * 1e6 / (2 * 1000e9)
    rest_far = far.ttft_s - mean_in * 1e6 / (2 * 100e9)
    assert far.ttft_s - near.ttft_s == pytest.approx(slow + rest_far - rest_near, rel=1e-9)
    assert slow > 0 and abs(rest_far - rest_near) < 0.1 * slow


def test_a_slow_prefill_pool_bounds_the_throughput() -> None:
    """One prompt a second per prefill worker (a step of m prompts takes m s): the pool serves
    at most 1 request a second, so the loop runs just under it, its clients queueing for
    prefill (TTFT = the cycle less the decode), and says so."""
    load = Load(64, 1024, 101)
    inputs, outputs = _by_hand_mean(load)
    state = disagg.steady(load, _pools(prefill=Stand(per_prompt=1.0)), 0.0, inputs, outputs)
    assert state.bound == "prefill"
    assert 0.97 < state.requests_per_s < 1.0
    dec = float(np.ceil(outputs - 1).mean()) * state.step_s
    assert state.ttft_s == pytest.approx(64 / state.requests_per_s - dec, rel=1e-6)


def test_a_full_kv_cache_bounds_the_decode_batch() -> None:
    """A decode worker holding 3 requests' KV (tokens for 3 of them) decodes 3 at a time; the
    other clients wait, and the loop says the KV cache bounds it."""
    load = Load(64, 1024, 101)
    inputs, outputs = _by_hand_mean(load)
    held = int(3 * (inputs.mean() + outputs.mean()))
    state = disagg.steady(load, _pools(decode=Stand(parallel=2, held=held)), 0.0, inputs, outputs)
    assert state.bound == "kv cache"
    assert state.batch == pytest.approx(3.0, rel=1e-3)
    dec = float(np.ceil(outputs - 1).mean()) * state.step_s
    assert state.requests_per_s == pytest.approx(2 * state.batch / dec, rel=1e-9)


def test_speculation_divides_the_decode_steps_by_the_al() -> None:
    """At AL 2.5 a request of O tokens decodes in ceil((O - 1) / 2.5) steps: its TPOT is those
    steps at the step price, over its O - 1 tokens."""
    load = Load(1, 1024, 101, num_spec_tokens=3, acceptance_length=2.5)
    figures = disagg.figures(load, _pools(workers=(1, 1)), 0.0)
    inputs, outputs = _by_hand_mean(load)
    steps = np.ceil((outputs - 1) / 2.5)
    state = disagg.steady(load, _pools(workers=(1, 1)), 0.0, inputs, outputs)
    expected = np.sort(steps * state.step_s / (outputs - 1))
    assert np.sort(figures.tpot_s) == pytest.approx(expected, rel=1e-12)


def test_throughput_per_gpu_counts_both_pools() -> None:
    """Input and output tokens a second over the prefill and the decode GPUs together."""
    pools = _pools(workers=(2, 3))
    figures = disagg.figures(LOAD, pools, 0.0)
    inputs, outputs = _by_hand_mean(LOAD)
    state = disagg.steady(LOAD, pools, 0.0, inputs, outputs)
    duration = len(outputs) / state.requests_per_s
    assert pools.gpus == 2 * 2 + 3 * 2
    assert figures.throughput_per_gpu == pytest.approx(
        (inputs.sum() + outputs.sum()) / duration / 10, rel=1e-12
    )


def test_an_open_loop_holds_littles_law_and_refuses_past_capacity() -> None:
    """At a rate X the batch is X·T_dec / W_d and a prompt waits as in a queue of deterministic
    batches (t·ρ / (2(1 − ρ))); a rate past the prefill pool's capacity (or the decode pool's)
    is refused, naming the capacity."""
    inputs, outputs = _by_hand_mean(LOAD)
    pools = _pools(prefill=Stand(per_prompt=0.1))  # 10 prompts a second
    state = disagg.steady(LOAD, pools, 0.0, inputs, outputs, rate=5.0)
    dec = float(np.ceil(outputs - 1).mean()) * state.step_s
    assert state.batch == pytest.approx(5.0 * dec / 2, rel=1e-6)
    full = 0.1 * (16384 // round(float(inputs.mean())))
    rho = 5.0 / 10.0
    transfer = float(inputs.mean()) * 1e6 / (2 * 1000e9)
    assert state.ttft_s == pytest.approx(0.1 + (full - 0.1) * rho + full * rho / (2 * (1 - rho))
                                         + transfer, rel=1e-9)  # fmt: skip
    with pytest.raises(OverloadedError, match="prefill pool serves at most"):
        disagg.steady(LOAD, _pools(prefill=Stand(per_prompt=1.0)), 0.0, inputs, outputs, rate=50)
    slow = Stand(parallel=2, held=int(2 * (inputs.mean() + outputs.mean())))
    with pytest.raises(OverloadedError, match="decode pool serves at most"):
        disagg.steady(LOAD, _pools(decode=slow), 0.0, inputs, outputs, rate=500.0)


def test_more_decode_workers_share_the_clients() -> None:
    """Round robin: 4 decode workers hold a quarter of the clients each, 1 holds them all."""
    load = Load(32, 1024, 101)
    inputs, outputs = _by_hand_mean(load)
    one = disagg.steady(load, _pools(workers=(1, 1)), 0.0, inputs, outputs)
    four = disagg.steady(load, _pools(workers=(1, 4)), 0.0, inputs, outputs)
    assert one.batch == pytest.approx(4 * four.batch, rel=0.02)
    assert four.step_s < one.step_s
    assert math.isfinite(four.ttft_s)


def test_only_the_decode_pool_speculates() -> None:
    """The pools a published point prices with: the drafter on the decode worker only."""
    from pathlib import Path

    from speclens.sim import catalog
    from speclens.sim import fit_points as fp
    from speclens.sim.roofline import Roofline

    settings = {"disaggregated": True, "concurrency": 8,
                "prefill": {"workers": 1, "gpus": 8, "expert_parallel": 8, "dp_attention": False},
                "decode": {"workers": 2, "gpus": 32, "expert_parallel": 16, "dp_attention": True}}  # fmt: skip
    point = fp.Point(Path("p"), settings, 0.01, 0.1, 100.0)
    roof = Roofline(catalog.model("deepseek-r1"), catalog.chip("gb200"), method="mtp")
    found = fp.pools(roof, point)
    assert (found.prefill.parallel, found.prefill.expert_parallel, found.prefill.method) == (
        8, 8, None)  # fmt: skip
    assert (found.decode.parallel, found.decode.expert_parallel, found.decode.dp_attention,
            found.decode.method) == (16, 16, True, "mtp")  # fmt: skip
    assert (found.prefill_workers, found.decode_workers, found.gpus) == (1, 2, 40)
    assert replace(found, decode_workers=1).gpus == 24


def test_the_medians_a_fit_reads_are_the_figures_medians() -> None:
    """``medians`` (what a fit reads hundreds of times) equals the full figures' median TPOT,
    TTFT and throughput per GPU, speculating or not."""
    pools = _pools(workers=(1, 3))
    for load in (
        Load(24, 1024, 101),
        Load(24, 1024, 101, num_spec_tokens=3, acceptance_length=2.3),
    ):
        full, quick = disagg.figures(load, pools, 0.02, 10), disagg.medians(load, pools, 0.02, 10)
        assert quick.median_tpot_s == pytest.approx(full.median_tpot_s, rel=1e-12)
        assert quick.median_ttft_s == pytest.approx(full.median_ttft_s, rel=1e-12)
        assert quick.throughput_per_gpu == pytest.approx(full.throughput_per_gpu, rel=1e-12)


def test_a_closed_loops_waves_queue_for_prefill() -> None:
    """64 clients began at once, so they return in waves, each spread over its decodes' spread
    (outputs of 80..101 tokens: 21 steps at the step's price). A prefill pool of 20 prompts a
    second takes a wave 3.2 s: a wave's median prompt waits half of what that exceeds its
    window, worked out here from the solved step price."""
    load = Load(64, 1024, 101)
    inputs, outputs = _by_hand_mean(load)
    assert (outputs.min(), outputs.max()) == (80, 101)
    pools = _pools(prefill=Stand(per_prompt=0.05, parallel=2))
    state = disagg.steady(load, pools, 0.0, inputs, outputs)
    m = 16384 // round(float(inputs.mean()))
    full, capacity = 0.05 * m, 1 / 0.05
    rho = state.requests_per_s / capacity
    wave = (64 / capacity - 21 * state.step_s) / 2
    assert wave > full * rho / 2  # the wave, not the steady trickle, sets the wait here
    transfer = float(inputs.mean()) * 1e6 / (2 * 1000e9)
    assert state.ttft_s == pytest.approx(0.05 + (full - 0.05) * rho + wave + transfer, rel=1e-6)
