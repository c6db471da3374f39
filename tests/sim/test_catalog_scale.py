"""Each chip's scale-up domain and scale-out bandwidth, and the roofline paying a collective
wider than the domain at the network's bandwidth: an all-to-all over more expert-parallel ranks
than one NVLink / Infinity Fabric domain joins, an all-reduce over more chips.

The prices are worked out by hand from DESIGN's collective terms, each chip's figures written out
here (not read from the code):

    all-reduce   N_ar  * 2 T (P - 1) / P * h * 2 B / (I e_i)
    all-to-all   N_a2a * 2 T n h * 2 B * (E - 1) / E / P / (I e_i)

with I the scale-up bandwidth while the collective's width fits the domain, else the scale-out.
Each check compares a chip with the same chip whose domain is lifted (today's pricing): the
difference is the collective bytes times (1 / scale-out - 1 / scale-up), the rest of the step
being the same.
"""

from __future__ import annotations

import re

import pytest

from speclens.sim import catalog
from speclens.sim.catalog import ChipSpec, Experts, ModelSpec
from speclens.sim.roofline import Efficiency, Roofline

#: Per shipped chip: the GPUs one scale-up fabric joins, and the RDMA NIC a GPU (Gb/s, one way)
#: its notes cite: ConnectX-7 400 Gb/s (HGX H100/H200/B200, GB200 trays, MI300X/MI325X nodes),
#: ConnectX-8 800 Gb/s (HGX B300, GB300 trays), Pensando Pollara 400 (MI355X nodes).
DATASHEET = {
    "h100": (8, 400), "h200": (8, 400), "b200": (8, 400), "b300": (8, 800),
    "gb200": (72, 400), "gb300": (72, 800),
    "mi300x": (8, 400), "mi325x": (8, 400), "mi355x": (8, 400),
}  # fmt: skip
#: The default interconnect efficiency (e_i), written out; scale-up GB/s one way (I).
E_I = 0.7
H200_NVLINK, GB200_NVLINK, NIC_400G = 450e9, 900e9, 400e9 / 8


def _a2a_seconds_a_byte(ep: int, domain: int, nvlink: float, nic: float) -> float:
    """An all-to-all over ``ep`` ranks past a ``domain``: (EP - D) / (EP - 1) of a token's remote
    experts sit on another node and cross the network, the rest stay on the fabric, both at
    once; the slower share sets the pace."""
    if ep <= domain:
        return 1 / (nvlink * E_I)
    crossing = (ep - domain) / (ep - 1)
    return max((1 - crossing) / (nvlink * E_I), crossing / (nic * E_I))


# DeepSeek-R1 (its config.json): 61 layers, the first 3 dense, 58 MoE; hidden 7,168; 8 routed
# experts a token. Under DP attention no attention all-reduce: N_ar = 3 (the dense MLPs),
# N_a2a = 58.
R1_DENSE, R1_MOE, R1_HIDDEN, R1_PER_TOKEN = 3, 58, 7168, 8


def _lifted(chip: ChipSpec) -> ChipSpec:
    """``chip`` with no scale-up domain stated: every collective on the scale-up fabric."""
    return chip.model_copy(update={"scale_up_domain": None})


def _r1(chip: ChipSpec, parallel: int, ep: int, method: str | None = None) -> Roofline:
    return Roofline(catalog.model("deepseek-r1"), chip, parallel, method=method,
                    efficiency=Efficiency(), expert_parallel=ep, dp_attention=True)  # fmt: skip


def _step(roof: Roofline, tokens: int = 64) -> float:
    """A decode step of ``tokens`` sequences at 2,048 tokens of context each."""
    return float(roof.verify(tokens, tokens, tokens * 2048))


def _r1_bytes(p: int, e: int) -> float:
    """DeepSeek-R1's collective bytes a token through each chip's link, under DP attention."""
    ring = R1_DENSE * 2 * (p - 1) / p * R1_HIDDEN * 2
    a2a = R1_MOE * 2 * R1_PER_TOKEN * R1_HIDDEN * 2 * (e - 1) / e / p
    return ring + a2a


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_each_shipped_chip_states_its_domain_and_network_and_cites_them(name: str) -> None:
    domain, nic_gbit = DATASHEET[name]
    chip = catalog.chip(name)
    assert (chip.scale_up_domain, chip.scale_out_gbps) == (domain, nic_gbit / 8)
    notes = " ".join((chip.notes or "").split())
    stated = re.search(r"Scale-up: .*", notes)
    assert stated is not None, notes
    assert f"{nic_gbit} Gb/s" in stated[0] and "https://" in stated[0], stated[0]
    assert f"{nic_gbit / 8:.0f} GB/s one way" in stated[0], stated[0]


def test_the_catalog_ships_no_chip_the_table_lacks() -> None:
    assert set(catalog.names("chips")) == set(DATASHEET)


def test_a_chip_without_the_fields_keeps_every_collective_on_its_interconnect() -> None:
    """A host chip (``calibrate --host``) states neither: the domain is unbounded; a domain
    without a network figure falls back on the interconnect."""
    host = ChipSpec(name="cpu", source="measured", tflops={"bf16": 0.4}, memory_gb=64,
                    memory_bandwidth_tbps=0.026, interconnect_gbps=13)  # fmt: skip
    assert (host.scale_up_domain, host.scale_out_gbps) == (None, None)
    assert [host.link_gbps(w) for w in (1, 8, 9, 1_000_000)] == [13.0] * 4
    bounded = host.model_copy(update={"scale_up_domain": 8})
    assert [bounded.link_gbps(w) for w in (8, 9)] == [13.0, 13.0]
    wired = bounded.model_copy(update={"scale_out_gbps": 2.5})
    assert [wired.link_gbps(w) for w in (1, 8, 9)] == [13.0, 13.0, 2.5]


def test_h200_at_ep_16_pays_its_all_to_all_and_all_reduce_at_the_nic() -> None:
    """EP 16 over two HGX H200 nodes (domain 8): the dense layers' all-reduce crosses the
    network at 50 GB/s, not NVLink's 450, and 8 of a token's 15 remote expert ranks sit on the
    other node. Per token, 3 x 2 x 15/16 x 7,168 x 2 = 80,640 bytes of all-reduce and
    58 x 2 x 8 x 7,168 x 2 x 15/16 / 16 = 779,520 of all-to-all; 64 tokens: the all-reduce at
    35 GB/s rather than 315, the all-to-all at 8/15 of its bytes over 35 GB/s: 0.733 ms more a
    step."""
    h200 = catalog.chip("h200")
    assert _r1_bytes(16, 16) == 80_640 + 779_520
    slower = 1 / (NIC_400G * E_I) - 1 / (H200_NVLINK * E_I)
    a2a = _a2a_seconds_a_byte(16, 8, H200_NVLINK, NIC_400G) - 1 / (H200_NVLINK * E_I)
    assert _a2a_seconds_a_byte(16, 8, H200_NVLINK, NIC_400G) == pytest.approx(8 / 15 / 35e9)
    extra = 64 * (80_640 * slower + 779_520 * a2a)
    assert extra == pytest.approx(0.733e-3, rel=1e-3)
    crossed = _step(_r1(h200, 16, 16)) - _step(_r1(_lifted(h200), 16, 16))
    assert crossed == pytest.approx(extra, rel=1e-6)


def test_h200_at_ep_8_prices_as_before() -> None:
    """EP 8 fits one node: the domain changes nothing (the width equal to it stays inside)."""
    h200 = catalog.chip("h200")
    for method in (None, "mtp"):
        inside, lifted = _r1(h200, 8, 8, method), _r1(_lifted(h200), 8, 8, method)
        assert _step(inside) == _step(lifted)
        assert float(inside.draft(32)) == float(lifted.draft(32))


def test_an_expert_group_inside_the_domain_keeps_its_all_to_all_on_nvlink() -> None:
    """TP 16 with EP 8 on h200: the all-reduce spans 16 chips (two nodes) and crosses the
    network, the all-to-all within each 8-rank expert group stays on NVLink. The step pays only
    the all-reduce's 3 x 2 x 15/16 x 7,168 x 2 = 80,640 bytes a token more; the MTP drafter,
    whose one collective is an all-to-all, nothing."""
    h200 = catalog.chip("h200")
    expected = 64 * 80_640 * (1 / (NIC_400G * E_I) - 1 / (H200_NVLINK * E_I))
    crossed = _step(_r1(h200, 16, 8)) - _step(_r1(_lifted(h200), 16, 8))
    assert crossed == pytest.approx(expected, rel=1e-6)
    assert float(_r1(h200, 16, 8, "mtp").draft(32)) == float(
        _r1(_lifted(h200), 16, 8, "mtp").draft(32)
    )


def test_an_all_to_all_alone_runs_at_the_nic() -> None:
    """A MoE model with no dense layer under DP attention has no all-reduce: the step's
    collectives are the all-to-all alone. 4 MoE layers, hidden 1,024, 4 experts a token, EP 16
    on h200: 4 x 2 x 4 x 1,024 x 2 x 15/16 / 16 = 3,840 bytes a token, at 35 GB/s not 315."""
    moe = ModelSpec(name="moe", source="test", num_hidden_layers=4, hidden_size=1024,
                    num_attention_heads=8, num_key_value_heads=8, intermediate_size=2048,
                    vocab_size=1000,
                    experts=Experts(routed=64, per_token=4, intermediate_size=512))  # fmt: skip
    h200 = catalog.chip("h200")

    def roof(chip: ChipSpec) -> Roofline:
        return Roofline(moe, chip, 16, efficiency=Efficiency(), expert_parallel=16,
                        dp_attention=True)  # fmt: skip

    a2a = 4 * 2 * 4 * 1024 * 2 * 15 / 16 / 16
    assert a2a == 3840
    crossed = _step(roof(h200), 256) - _step(roof(_lifted(h200)), 256)
    expected = 256 * a2a * (_a2a_seconds_a_byte(16, 8, H200_NVLINK, NIC_400G)
                            - 1 / (H200_NVLINK * E_I))  # fmt: skip
    assert crossed == pytest.approx(expected, rel=1e-6)


def test_the_mtp_drafters_all_to_all_crosses_the_network_too() -> None:
    """DeepSeek-R1's MTP layer is one MoE layer: under DP attention its collective is one
    all-to-all, 2 x 8 x 7,168 x 2 x 15/16 / 16 = 13,440 bytes a drafting token at EP 16."""
    h200 = catalog.chip("h200")
    crossed = float(_r1(h200, 16, 16, "mtp").draft(32)) - float(
        _r1(_lifted(h200), 16, 16, "mtp").draft(32)
    )
    expected = 32 * 13_440 * (_a2a_seconds_a_byte(16, 8, H200_NVLINK, NIC_400G)
                              - 1 / (H200_NVLINK * E_I))  # fmt: skip
    assert crossed == pytest.approx(expected, rel=1e-6)


def test_a_tensor_parallel_all_reduce_wider_than_the_domain_crosses_the_network() -> None:
    """Llama-3.1-70B at TP 16 on h200: 80 layers x 2 all-reduces x 2 x 15/16 x 8,192 x 2 =
    4,915,200 bytes a token at 35 GB/s; at TP 8 as before."""
    h200, llama = catalog.chip("h200"), catalog.model("llama-3.1-70b")

    def step(chip: ChipSpec, tp: int) -> float:
        return _step(Roofline(llama, chip, tp, efficiency=Efficiency()), 32)

    ring = 80 * 2 * 2 * 15 / 16 * 8192 * 2
    assert ring == 4_915_200
    expected = 32 * ring * (1 / (NIC_400G * E_I) - 1 / (H200_NVLINK * E_I))
    assert step(h200, 16) - step(_lifted(h200), 16) == pytest.approx(expected, rel=1e-6)
    assert step(h200, 8) == step(_lifted(h200), 8)


def test_gb200_at_ep_32_stays_on_nvlink() -> None:
    """32 of an NVL72 rack's 72 GPUs share one NVLink domain: priced as before. Were the domain
    16, the all-reduce would cross at 50 GB/s rather than 900 (3 x 2 x 31/32 x 7,168 x 2 =
    83,328 bytes a token), and 16 of a token's 31 remote expert ranks would sit in the other
    domain (58 x 2 x 8 x 7,168 x 2 x 31/32 / 32 = 402,752 bytes, 16/31 of them at 50 GB/s)."""
    gb200 = catalog.chip("gb200")
    assert _step(_r1(gb200, 32, 32)) == _step(_r1(_lifted(gb200), 32, 32))
    assert _r1_bytes(32, 32) == 83_328 + 402_752
    small = gb200.model_copy(update={"scale_up_domain": 16})
    crossed = _step(_r1(small, 32, 32)) - _step(_r1(gb200, 32, 32))
    nvlink = 1 / (GB200_NVLINK * E_I)
    expected = 64 * (
        83_328 * (1 / (NIC_400G * E_I) - nvlink)
        + 402_752 * (_a2a_seconds_a_byte(32, 16, GB200_NVLINK, NIC_400G) - nvlink)
    )
    assert _a2a_seconds_a_byte(32, 16, GB200_NVLINK, NIC_400G) == pytest.approx(16 / 31 / 35e9)
    assert crossed == pytest.approx(expected, rel=1e-6)
