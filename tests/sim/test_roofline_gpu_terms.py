"""The roofline's terms for what GPU serving engines run, against prices worked out by hand from
DeepSeek-R1's config.json and the chips' datasheets, never from ``Shape`` or ``Roofline``:

- the MTP drafter is the model's own MTP layer (one whole MoE decoder layer, its ``eh_proj`` and
  the target's LM head), already among the model's weights: not an average layer, and not added
  twice; while it drafts it keeps one more layer of latent KV a token;
- expert parallelism trades a MoE layer's all-reduce for an all-to-all dispatch and combine;
  DP attention drops attention's all-reduce, replicates its weights and splits the KV by rank;
- FP4 routed experts (``with_precision``) are half the bytes and run at the chip's FP4 peak;
- chunked prefill mixed with decodes reads the weights once for all of the step's tokens, its
  chunk attends causally within each prompt and its KV read is the decodes', the prompts' prefix
  and the chunk's own, once; the MTP drafter pays its MoE layer's all-to-all under EP;
- a chip's efficiency defaults are what a roofline takes where its caller gives none;
- the table-priced fast path gives the formula's prices.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from speclens.acceptance import ValidationError
from speclens.sim import catalog
from speclens.sim.catalog import ChipSpec, with_precision
from speclens.sim.roofline import MAX_TABLE, Efficiency, Roofline, Shape
from speclens.sim.scenario import load_scenario, pool_cost

# --- DeepSeek-R1 (deepseek-ai/DeepSeek-R1 config.json) on H200 (dense FP8 1,979 TFLOP/s) -----
# 61 layers (3 dense, 58 MoE), hidden 7168, 128 heads, MLA (q_lora 1536, kv_lora 512, rope 64,
# nope 128, v 128), 256 routed experts of 2048 (8 a token), 1 shared, vocab 129280, FP8 weights.
ATTENTION = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
EXPERT, ROUTER, LM_HEAD = 3 * 7168 * 2048, 7168 * 256, 129280 * 7168
EH_PROJ = 2 * 7168 * 7168  # the MTP layer's projection of [embedding; hidden state]
#: The MTP layer's parameters every drafted token runs through: attention, shared expert,
#: router and eh_proj (its routed experts aside).
MTP_DENSE = ATTENTION + EXPERT + ROUTER + EH_PROJ
#: The model card's 671B (main model): every token's part, embedding and LM head, routed experts.
MAIN = 61 * ATTENTION + 3 * 3 * 7168 * 18432 + 58 * (EXPERT + ROUTER) + 2 * LM_HEAD
MAIN += 58 * 256 * EXPERT
MTP_HELD = MTP_DENSE + 256 * EXPERT  # bytes (FP8): every routed expert of the MTP layer held
KV = 61 * (512 + 64) * 2  # latent and rope key a layer, bf16
PAIR = 61 * 2 * 128 * (2 * 512 + 64)
H200_FP8, H200_BANDWIDTH, NVLINK = 1979e12, 4.8e12, 450e9
COMPUTE, MEMORY, INTERCONNECT, LATENCY = 0.5, 0.8, 0.7, 1e-5
IDLE = Efficiency(overhead=0.0, per_sequence=0.0)


def _touched(tokens: float) -> float:
    return 256 * (1 - (1 - 8 / 256) ** tokens)


def _ring(tokens: float, chips: int = 8) -> float:
    """One ring all-reduce of ``tokens`` bf16 activations at TP ``chips``, with its latency."""
    return 2 * (chips - 1) / chips * tokens * 7168 * 2 / (NVLINK * INTERCONNECT) + LATENCY


def _a2a(tokens: float, ep: int = 8, chips: int = 8) -> float:
    """One MoE layer's all-to-all: each token's activations to its 8 experts' ranks and back,
    (EP - 1) / EP of them on another rank, the sending spread over the chips; two latencies."""
    wire = 2 * tokens * 8 * 7168 * 2 * (ep - 1) / ep / chips
    return wire / (NVLINK * INTERCONNECT) + 2 * LATENCY


def test_deepseek_r1_entry_is_its_config() -> None:
    m = catalog.model("deepseek-r1")
    assert m.source == "https://huggingface.co/deepseek-ai/DeepSeek-R1/blob/main/config.json"
    assert (m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == (
        61, 7168, 128, 129280)  # fmt: skip
    assert m.experts is not None and m.mla is not None
    assert (m.experts.routed, m.experts.per_token, m.experts.shared) == (256, 8, 1)
    assert (m.experts.intermediate_size, m.experts.dense_layers) == (2048, 3)
    assert (m.mla.kv_lora_rank, m.mla.q_lora_rank, m.mtp_layers, m.dtype) == (512, 1536, 1, "fp8")
    # DeepSeek-V3's architecture exactly.
    assert Shape.of(m) == Shape.of(catalog.model("deepseek-v3"))


def test_mla_latent_kv_of_deepseek_r1_by_hand() -> None:
    """61 layers x (512 latent + 64 rope) x 2 bytes = 70,272 bytes a token; at TP 8 every rank
    holds it whole: (141 GB x 0.9 x 8 - the weights) / 70,272 tokens."""
    shape = Shape.of(catalog.model("deepseek-r1"))
    assert shape.kv_bytes_per_token == KV == 70_272
    weights = MAIN + MTP_HELD
    roof = Roofline(catalog.model("deepseek-r1"), catalog.chip("h200"), 8)
    assert roof.kv_tokens() == math.floor((141e9 * 0.9 * 8 - weights) / (KV * 8))


def test_the_mtp_layer_is_held_once_as_a_whole_moe_layer() -> None:
    """The MTP layer holds all 256 of its experts (11.61 GB in FP8, not an average layer's
    0.59 GB), and method mtp prices the model's own layer: nothing added to the weights."""
    assert MAIN == 671_025_397_760 and MTP_HELD == 11_610_030_080
    model, h200 = catalog.model("deepseek-r1"), catalog.chip("h200")
    assert Shape.of(model).weights_bytes() == MAIN + MTP_HELD
    plain = Roofline(model, h200, 8)
    mtp = Roofline(model, h200, 8, method="mtp")
    assert mtp.weights_bytes() == plain.weights_bytes() == MAIN + MTP_HELD
    # While it drafts, the MTP layer keeps one more layer of latent a token.
    assert mtp.kv_bytes_per_token() == KV + 576 * 2
    free = 141e9 * 0.9 * 8 - MAIN - MTP_HELD  # every rank holds every token's latent whole
    assert mtp.kv_tokens() == math.floor(free / ((KV + 1152) * 8))
    assert plain.kv_tokens() > mtp.kv_tokens()


def test_the_mtp_drafter_is_priced_as_its_moe_layer_and_the_lm_head() -> None:
    """One MTP forward over d drafting requests at TP 8: its attention, shared expert, router
    and eh_proj, the routed experts the d tokens touch, and the LM head (memory: each weight
    read once; compute: 2 FLOPs a parameter a token), its two all-reduces; in a decode step K
    of them, each with the layer's attention over the drafting requests' contexts."""
    roof = Roofline(catalog.model("deepseek-r1"), catalog.chip("h200"), 8, method="mtp",
                    efficiency=IDLE)  # fmt: skip

    def draft(d: int) -> float:
        flops = 2 * (MTP_DENSE + 8 * EXPERT + LM_HEAD)
        read = MTP_DENSE + LM_HEAD + _touched(d) * EXPERT
        linear = max(flops * d / (H200_FP8 * COMPUTE * 8), read / (H200_BANDWIDTH * MEMORY * 8))
        return linear + 2 * _ring(d)

    for d in (1, 4, 64, 512):
        assert roof.draft(d) == pytest.approx(draft(d), rel=1e-9), d
    # A decode step of 16 verify tokens of 4 requests at 2,000 each, all 4 drafting, K = 3.
    mean_context = 2000
    attention = max(
        PAIR / 61 * 4 * mean_context / (H200_FP8 * COMPUTE * 8),
        576 * 2 * 4 * mean_context / (H200_BANDWIDTH * MEMORY),  # the latent, read whole
    )
    drafter = roof.decode(16, 4, 8000, 4, 3) - roof.verify(16, 4, 8000)
    assert drafter == pytest.approx(3 * (draft(4) + attention), rel=1e-9)
    # Its experts are those the drafting requests touch, not the verify step's tokens: priced
    # from the tables, and by the formula.
    for decode in (roof.decode, roof._decode_formula):
        assert decode(16, 4, 8000, 1, 3) - roof.verify(16, 4, 8000) == pytest.approx(
            3 * (draft(1) + attention / 4), rel=1e-9
        )


def test_the_mtp_drafter_pays_its_moe_layers_collectives_under_expert_parallelism() -> None:
    """The MTP layer is a MoE layer: at TP 8 with EP 8 a forward over d drafting requests pays
    attention's all-reduce and its routed experts' all-to-all dispatch and combine (two
    latencies), not a second all-reduce; under DP attention the all-to-all alone, and every rank
    reads the layer's attention weights (7 more copies over the 8 chips). At d = 64: the weights
    360.0 us (11.06 GB at 8 x 3.84 TB/s), the all-reduce 15.1 us, the all-to-all 25.1 us:
    400.2 us; under DP attention 402.6 + 25.1 = 427.7 us."""
    model, h200 = catalog.model("deepseek-r1"), catalog.chip("h200")
    ep = Roofline(model, h200, 8, method="mtp", efficiency=IDLE, expert_parallel=8)
    dpa = Roofline(model, h200, 8, method="mtp", efficiency=IDLE, expert_parallel=8,
                   dp_attention=True)  # fmt: skip

    def weights(d: int, replicated: float = 0.0) -> float:
        flops = 2 * (MTP_DENSE + 8 * EXPERT + LM_HEAD)
        read = MTP_DENSE + LM_HEAD + _touched(d) * EXPERT + replicated
        return max(flops * d / (H200_FP8 * COMPUTE * 8), read / (H200_BANDWIDTH * MEMORY * 8))

    assert weights(64) + _ring(64) + _a2a(64) == pytest.approx(400.2e-6, rel=1e-4)
    assert weights(64, 7 * ATTENTION) + _a2a(64) == pytest.approx(427.7e-6, rel=1e-4)
    for d in (1, 4, 64, 512):
        assert ep.draft(d) == pytest.approx(weights(d) + _ring(d) + _a2a(d), rel=1e-9), d
        assert dpa.draft(d) == pytest.approx(weights(d, 7 * ATTENTION) + _a2a(d), rel=1e-9), d
    # In a decode step of 16 verify tokens of 4 requests at 2,000 each, all drafting, K = 3:
    # each forward adds the layer's attention over their contexts (under DP attention each rank
    # reads its own requests' latent: an eighth).
    for roof, shards, replicated, collectives in ((ep, 1, 0.0, _ring(4) + _a2a(4)),
                                                  (dpa, 8, 7 * ATTENTION, _a2a(4))):  # fmt: skip
        attention = max(
            PAIR / 61 * 4 * 2000 / (H200_FP8 * COMPUTE * 8),
            576 * 2 * 4 * 2000 / (H200_BANDWIDTH * MEMORY * shards),
        )
        drafter = roof.decode(16, 4, 8000, 4, 3) - roof.verify(16, 4, 8000)
        expected = 3 * (weights(4, replicated) + collectives + attention)
        assert drafter == pytest.approx(expected, rel=1e-9)


def _forward(tokens: int, requests: int, context: int, collectives: float,
             extra_read: float = 0.0, kv_shards: int = 1) -> float:  # fmt: skip
    flops = 2 * (MAIN - 2 * LM_HEAD - 58 * 256 * EXPERT + 58 * 8 * EXPERT + LM_HEAD)
    read = MAIN - LM_HEAD - 58 * 256 * EXPERT + 58 * _touched(tokens) * EXPERT + extra_read
    linear = max(flops * tokens / (H200_FP8 * COMPUTE * 8), read / (H200_BANDWIDTH * MEMORY * 8))
    attention = max(
        PAIR * tokens * (context / requests) / (H200_FP8 * COMPUTE * 8),
        KV * context / (H200_BANDWIDTH * MEMORY * kv_shards),
    )
    return linear + attention + collectives


def test_expert_parallelism_trades_the_moe_all_reduce_for_an_all_to_all() -> None:
    """TP 8 with EP 8: attention's 61 all-reduces and the 3 dense MLPs' stay; the 58 MoE layers
    each dispatch and combine their tokens' activations instead. EP 1 is TP's pricing."""
    model, h200 = catalog.model("deepseek-r1"), catalog.chip("h200")
    tp = Roofline(model, h200, 8, efficiency=IDLE)
    ep = Roofline(model, h200, 8, efficiency=IDLE, expert_parallel=8)
    one = Roofline(model, h200, 8, efficiency=IDLE, expert_parallel=1)
    for tokens, requests, context in ((64, 64, 64 * 2000), (1024, 256, 256 * 1024), (1, 1, 9)):
        by_tp = _forward(tokens, requests, context, 122 * _ring(tokens))
        assert tp.verify(tokens, requests, context) == pytest.approx(by_tp, rel=1e-9)
        assert one.verify(tokens, requests, context) == tp.verify(tokens, requests, context)
        by_ep = _forward(tokens, requests, context, 64 * _ring(tokens) + 58 * _a2a(tokens))
        assert ep.verify(tokens, requests, context) == pytest.approx(by_ep, rel=1e-9)
    assert ep.problems() == [] and tp.problems() == []
    assert Roofline(model, h200, 4, expert_parallel=8).problems()
    assert Roofline(catalog.model("llama-3.1-8b"), h200, 2, expert_parallel=2).problems()


def test_dp_attention_replicates_attention_and_splits_the_kv_by_rank() -> None:
    """DP attention at 8 ranks with EP 8: no attention all-reduce (3 dense-MLP all-reduces and
    58 all-to-alls remain), every rank reads all 61 layers' attention weights, and each keeps
    and reads only its own sequences' latent KV (an eighth); capacity likewise."""
    model, h200 = catalog.model("deepseek-r1"), catalog.chip("h200")
    dpa = Roofline(model, h200, 8, efficiency=IDLE, expert_parallel=8, dp_attention=True)
    replicated = 7 * 61 * ATTENTION  # bytes the other 7 ranks read again, all ranks together
    for tokens, requests, context in ((64, 64, 64 * 2000), (512, 512, 512 * 3000)):
        expected = _forward(tokens, requests, context, 3 * _ring(tokens) + 58 * _a2a(tokens),
                            extra_read=replicated, kv_shards=8)  # fmt: skip
        assert dpa.verify(tokens, requests, context) == pytest.approx(expected, rel=1e-9)
    free = 141e9 * 0.9 * 8 - MAIN - MTP_HELD - 7 * 62 * ATTENTION
    assert dpa.kv_tokens() == math.floor(free / KV)


def test_fp4_experts_are_half_the_bytes_at_the_fp4_peak() -> None:
    """with_precision('fp4'): the routed experts in FP4 (0.5 byte), their matmuls at the chip's
    FP4 peak (B200: 9,000 dense TFLOP/s) or, without one, at its FP8 peak (H200); the rest
    stays FP8. 'fp8' on a bf16 model halves every weight; None changes nothing."""
    model = catalog.model("deepseek-r1")
    assert with_precision(model, None) is model
    fp4 = with_precision(model, "fp4")
    assert fp4.experts is not None and (fp4.experts.dtype, fp4.dtype) == ("fp4", "fp8")
    routed = 58 * 256 * EXPERT
    expected = MAIN - routed + routed / 2 + MTP_DENSE + 256 * EXPERT / 2
    assert Shape.of(fp4).weights_bytes() == expected
    b200 = Roofline(fp4, catalog.chip("b200"), 8, efficiency=IDLE)
    assert (b200.dtype, b200.expert_dtype) == ("fp8", "fp4")
    assert Roofline(fp4, catalog.chip("h200"), 8).expert_dtype == "fp8"
    assert Roofline(model, catalog.chip("b200"), 8).expert_dtype == "fp8"
    # A prefill chunk of 8,192 tokens: compute-bound; the experts' FLOPs at 9 PFLOP/s.
    tokens = 8192
    dense_flops = 2 * (MAIN - 2 * LM_HEAD - routed + LM_HEAD)
    expert_flops = 2 * 58 * 8 * EXPERT
    compute = tokens * (dense_flops / 4500e12 + expert_flops / 9000e12) / (COMPUTE * 8)
    attention = max(
        PAIR * tokens * tokens / (4500e12 * COMPUTE * 8), KV * tokens / (7.7e12 * MEMORY)
    )
    ring = 2 * 7 / 8 * tokens * 7168 * 2 / (900e9 * INTERCONNECT) + LATENCY
    expected = compute + attention + 122 * ring
    assert b200.verify(tokens, 1, tokens) == pytest.approx(expected, rel=1e-9)
    # Where the experts' matmuls ran at the FP8 peak, the same chunk would take longer.
    at_fp8 = tokens * (dense_flops + expert_flops) / 4500e12 / (COMPUTE * 8)
    assert at_fp8 > compute
    llama = catalog.model("llama-3.1-8b")
    assert (
        Shape.of(with_precision(llama, "fp8")).weights_bytes() * 2
        == Shape.of(llama).weights_bytes()
    )
    with pytest.raises(ValidationError) as caught:
        with_precision(model, "int4", "s.yaml", "precision")
    (problem,) = caught.value.problems
    assert (problem.file, problem.path) == ("s.yaml", "precision")
    assert "'int4'" in problem.message and "fp8, fp4" in problem.message


# --- chunked prefill mixed with decodes: Llama-3.1-8B on one H100 ------------------------------
LLAMA_MATMULS, LLAMA_KV, LLAMA_PAIR = 7_504_658_432, 131_072, 524_288
H100_BF16, H100_BANDWIDTH = 989.5e12, 3.35e12


def test_a_mixed_step_reads_the_weights_once_for_decodes_and_the_prefill_chunk() -> None:
    """8 sequences decoding at 1,000 tokens each, and a 512-token chunk of a prompt with 1,024
    of its tokens already in the KV: one read of the weights for 520 tokens (compute-bound),
    attention over 8 x 1,000 decode pairs and 512 x (1,024 + 256) causal chunk pairs, the KV of
    the decodes' contexts and of the prompt; then overhead and 9 sequences."""
    roof = Roofline(catalog.model("llama-3.1-8b"), catalog.chip("h100"), efficiency=Efficiency())
    e = roof.efficiency
    tokens = 8 + 512
    linear = max(2 * LLAMA_MATMULS * tokens / (H100_BF16 * COMPUTE),
                 2 * LLAMA_MATMULS / (H100_BANDWIDTH * MEMORY))  # fmt: skip
    pairs = 8 * 1000 + 512 * (1024 + 512 / 2)
    attention = max(LLAMA_PAIR * pairs / (H100_BF16 * COMPUTE),
                    LLAMA_KV * (8000 + 1024 + 512) / (H100_BANDWIDTH * MEMORY))  # fmt: skip
    expected = e.overhead + 9 * e.per_sequence + linear + attention
    assert roof.mixed(8, 8, 8000, 512, 1, 1024, 0, 0) == pytest.approx(expected, rel=1e-9)
    apart = roof.decode(8, 8, 8000, 0, 0) + roof.prefill(512, 1, 1024 + 512)
    assert roof.mixed(8, 8, 8000, 512, 1, 1024, 0, 0) < apart
    # With no prefill a mixed step is a decode step, drafter included (arrays elementwise).
    eagle = Roofline(
        catalog.model("llama-3.1-8b"), catalog.chip("h100"), method="eagle", efficiency=Efficiency()
    )
    q, r = np.array([8, 32, 4]), np.array([2, 8, 1])
    c, d = np.array([900, 16000, 7]), np.array([2, 0, 1])
    zero = np.zeros(3)
    got = eagle.mixed(q, r, c, zero, zero, zero, d, 3)
    assert np.allclose(got, eagle._decode_formula(q, r, c, d, 3), rtol=1e-12, atol=0)


def _llama_mixed(decodes: int, prompts: int, chunk: int, pairs: float, kv_tokens: float) -> float:
    """A mixed step of Llama-3.1-8B on one H100 at the global defaults: ``decodes`` decoding
    sequences and a chunk of ``chunk`` prompt tokens of ``prompts`` prompts, the weights read
    once for all; its attention's ``pairs`` and ``kv_tokens`` as the caller works them out."""
    tokens = decodes + chunk
    linear = max(2 * LLAMA_MATMULS * tokens / (H100_BF16 * COMPUTE),
                 2 * LLAMA_MATMULS / (H100_BANDWIDTH * MEMORY))  # fmt: skip
    attention = max(LLAMA_PAIR * pairs / (H100_BF16 * COMPUTE),
                    LLAMA_KV * kv_tokens / (H100_BANDWIDTH * MEMORY))  # fmt: skip
    return 1e-3 + 2e-5 * (decodes + prompts) + linear + attention


def test_a_mixed_chunk_of_two_prompts_attends_causally_within_each() -> None:
    """4 sequences decoding at 500 each, and a chunk of two prompts of 1,024 tokens, each with
    3,072 of its tokens already in the KV: each prompt's token i attends 3,072 + i of its own,
    1,024 x (3,072 + 1,024 / 2) pairs a prompt, 7,340,032 both and 7,342,032 with the decodes'
    2,000. Attention is compute-bound: 524,288 x 7,342,032 / 494.75 TFLOP/s = 7.78 ms (its KV,
    2,000 + 2 x 3,072 + 2,048 tokens, 0.50 ms). With the weights' 2,052 tokens (62.25 ms), the
    overhead and 6 sequences: 71.15 ms. Read as one prompt of 2,048 (2,048 x (3,072 + 1,024))
    the pairs would be 1,048,576 more, 1.11 ms; with no causal half (2,048 x 3,072) 1,048,576
    fewer."""
    pairs = 4 * 500 + 2 * 1024 * (3072 + 1024 / 2)
    assert pairs == 7_342_032
    compute_bound = _llama_mixed(4, 2, 2048, pairs, 2000 + 2 * 3072 + 2048)
    assert compute_bound == pytest.approx(71.152e-3, rel=1e-4)
    roof = Roofline(catalog.model("llama-3.1-8b"), catalog.chip("h100"), efficiency=Efficiency())
    assert roof.mixed(4, 4, 2000, 2048, 2, 3072, 0, 0) == pytest.approx(compute_bound, rel=1e-9)
    one_prompt = 4 * 500 + 2048 * (3072 + 2048 / 2)
    assert one_prompt - pairs == 1_048_576 == pairs - (4 * 500 + 2048 * 3072)
    assert roof.mixed(4, 4, 2000, 2048, 1, 3072, 0, 0) > compute_bound  # one prompt: more pairs
    # Arrays price each step as alone: this one, and the KV-bound step below.
    q, r, c = np.array([4, 64]), np.array([4, 64]), np.array([2000, 256_000])
    p, rp, before = np.array([2048, 32]), np.array([2, 2]), np.array([3072, 3000])
    zero = np.zeros(2)
    got = roof.mixed(q, r, c, p, rp, before, zero, 0)
    assert got[0] == pytest.approx(compute_bound, rel=1e-9)
    assert got[1] == pytest.approx(roof.mixed(64, 64, 256_000, 32, 2, 3000, 0, 0), rel=1e-12)


def test_a_mixed_step_reads_the_decodes_kv_the_prompts_prefix_and_the_chunk_once() -> None:
    """64 sequences decoding at 4,000 each, and a chunk of two prompts of 16 tokens after 3,000
    each: the KV read is the decodes' 256,000 tokens, each prompt's 3,000 before the chunk and
    the chunk's own 32 (written, then attended to), once: 262,032 x 131,072 bytes at
    2.68 TB/s = 12.82 ms; the pairs, 64 x 4,000 + 2 x 16 x (3,000 + 8) = 352,256, take 0.37 ms.
    The weights read once (5.60 ms), the overhead and 66 sequences: 20.74 ms. Without the
    chunk's own KV 1.6 us less, with it twice 1.6 us more, with one prompt's prefix 147 us
    less."""
    pairs = 64 * 4000 + 2 * 16 * (3000 + 16 / 2)
    kv_tokens = 64 * 4000 + 2 * 3000 + 32
    memory_bound = _llama_mixed(64, 2, 32, pairs, kv_tokens)
    assert memory_bound == pytest.approx(20.736e-3, rel=1e-4)
    kv_seconds = LLAMA_KV * kv_tokens / (H100_BANDWIDTH * MEMORY)
    assert kv_seconds == pytest.approx(12.815e-3, rel=1e-4)
    assert kv_seconds > LLAMA_PAIR * pairs / (H100_BF16 * COMPUTE)  # memory-bound
    roof = Roofline(catalog.model("llama-3.1-8b"), catalog.chip("h100"), efficiency=Efficiency())
    assert roof.mixed(64, 64, 256_000, 32, 2, 3000, 0, 0) == pytest.approx(memory_bound, rel=1e-9)
    # The chunk's own 32 tokens of KV are 1.57 us of it, far above the tolerance above.
    chunk_kv = LLAMA_KV * 32 / (H100_BANDWIDTH * MEMORY)
    assert chunk_kv == pytest.approx(1.565e-6, rel=1e-3) and chunk_kv > 1e-6 * memory_bound


# --- a chip's efficiency defaults ----------------------------------------------------------------
def _chip(tmp_path: Path, **efficiency: object) -> Path:
    entry = catalog.chip("h100").model_dump(exclude_none=True)
    entry["efficiency"] = efficiency
    path = tmp_path / "chip.yaml"
    path.write_text(yaml.safe_dump(entry))
    return path


def test_a_chips_efficiency_is_the_rooflines_default(tmp_path: Path) -> None:
    chip = catalog.read_chip(_chip(tmp_path, memory=0.6, overhead=0.002))
    assert chip.efficiency is not None
    model = catalog.model("llama-3.1-8b")
    roof = Roofline(model, chip)
    assert (roof.efficiency.memory, roof.efficiency.overhead) == (0.6, 0.002)
    assert roof.efficiency.compute == Efficiency().compute  # not given: the global default
    bare = catalog.chip("h100").model_copy(update={"efficiency": None, "fitted_on": None})
    assert roof.verify(1, 1, 100) > Roofline(model, bare).verify(1, 1, 100)
    stated = Efficiency(memory=0.9)
    assert Roofline(model, chip, efficiency=stated).efficiency is stated
    assert Roofline(model, bare).efficiency == Efficiency()  # a chip without: the global ones
    # A scenario's pool states some fields: those over the chip's, the rest the chip's.
    scenario = {
        "model": "llama-3.1-8b", "hardware_file": "chip.yaml",
        "deployment": {"pools": [{"efficiency": {"compute": 0.7}}]},
    }  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    loaded = load_scenario(path)
    cost = pool_cost(loaded.deployment.pools[0], tmp_path, loaded)
    assert isinstance(cost, Roofline)
    assert (cost.efficiency.compute, cost.efficiency.memory, cost.efficiency.overhead) == (
        0.7, 0.6, 0.002)  # fmt: skip


@pytest.mark.parametrize(
    ("efficiency", "path"),
    [({"memory": 1.5}, "efficiency.memory"), ({"overhead": -1}, "efficiency.overhead"),
     ({"speed": 1}, "efficiency")],
)  # fmt: skip
def test_a_chips_bad_efficiency_names_its_field(
    tmp_path: Path, efficiency: dict[str, object], path: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        catalog.read_chip(_chip(tmp_path, **efficiency))
    assert [p.path for p in caught.value.problems] == [path]
    if path == "efficiency":  # an unknown key: where it is, and the keys there are
        assert "expected one of compute, memory" in caught.value.problems[0].message


def test_a_shipped_chips_efficiencies_say_where_they_come_from() -> None:
    """A chip's efficiency defaults are fitted on published runs, never read off a datasheet:
    the entry says so and names the benchmark that fitted them (single-node runs, or, for a
    chip that ran none, its disaggregated ones), and a chip with no such runs says why it has
    none."""
    stated = [n for n in catalog.names("chips") if catalog.chip(n).efficiency is not None]
    assert {"h200", "mi355x", "b200", "gb200"} <= set(stated)
    for name in catalog.names("chips"):
        chip = catalog.chip(name)
        assert isinstance(chip, ChipSpec)
        notes = " ".join((chip.notes or "").split())
        if chip.efficiency is not None:
            assert chip.fitted_on is not None, name
            script = {"single-node": "benchmarks/inferencex.py",
                      "disaggregated": "benchmarks/inferencex_disagg.py"}[chip.fitted_on.runs]  # fmt: skip
            assert "fitted on this data" in notes and script in notes, name
        else:
            assert "No efficiency defaults" in notes


# --- the table-priced fast path gives the formula's prices --------------------------------------
def _rooflines(tmp_path: Path) -> list[Roofline]:
    ds, b200 = catalog.model("deepseek-r1"), catalog.chip("b200")
    host = catalog.chip("h100").model_copy(update={"measured": {"matmul_tflops_by_tokens": {
        "bf16": {"1": 30.0, "16": 300.0, "256": 700.0}}}})  # fmt: skip
    llama = catalog.model("llama-3.1-8b")
    return [
        Roofline(catalog.model("kimi-k3"), catalog.chip("b300"), 8, method="dspark"),
        Roofline(ds, catalog.chip("h200"), 8, method="mtp"),
        Roofline(
            ds,
            catalog.chip("h200"),
            8,
            method="mtp",
            efficiency=Efficiency(per_token=8e-5, per_sequence=0.0),
        ),
        Roofline(
            with_precision(ds, "fp4"), b200, 8, method="mtp", expert_parallel=8, dp_attention=True
        ),
        Roofline(llama, host, method="eagle", draft_layers=2),
        Roofline(
            llama,
            catalog.chip("h100"),
            method="draft_model",
            drafter=Roofline(catalog.model("smollm2-135m"), catalog.chip("h100")),
        ),
        Roofline(llama, catalog.chip("h100"), method="ngram"),
        Roofline(llama, catalog.chip("h100")),
    ]


def test_the_fast_path_prices_as_the_formula(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    for roof in _rooflines(tmp_path):
        for k in (0, 1, 3, 7):
            seqs = rng.integers(1, 300, size=200)
            drafting = rng.integers(0, seqs + 1)
            query = seqs + k * drafting
            context = seqs * rng.integers(1, 40_000, size=200)
            want = roof._decode_formula(query, seqs, context, drafting, k)
            got = roof.decode(query, seqs, context, drafting, k)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
            as_float = roof.decode(query.astype(float), seqs, context, drafting.astype(float), k)
            np.testing.assert_allclose(as_float, want, rtol=1e-12, atol=0)
            for i in range(0, 200, 37):  # one step at a time, as the step-exact loop asks
                one = roof.decode(int(query[i]), int(seqs[i]), int(context[i]),
                                  int(drafting[i]), k)  # fmt: skip
                assert isinstance(one, float)
                assert one == pytest.approx(float(want[i]), rel=1e-12)
        prompts = rng.integers(1, 20_000, size=50)
        want = roof._verify_formula(prompts, np.ones(50), prompts, 0.0)  # no per-token price
        np.testing.assert_allclose(roof.prefill(prompts, np.ones(50), prompts), want, rtol=1e-12)
        assert roof.prefill(int(prompts[0]), 1, int(prompts[0])) == pytest.approx(
            float(want[0]), rel=1e-12
        )
        # Past the tables, and counts that are not whole, the formula prices them itself.
        big = np.array([MAX_TABLE + 5])
        per_token = roof.efficiency.per_token
        assert roof.verify(big, big, big)[0] == roof._verify_formula(big, big, big, per_token)[0]
        half = np.array([2.5])
        assert roof.verify(half, half, half)[0] == roof._verify_formula(half, half, half,
                                                                         per_token)[0]  # fmt: skip


def test_per_token_prices_a_decode_steps_positions_not_a_prompts() -> None:
    """``per_token`` is paid per query token of a decode (verify) step, K + 1 a speculating
    sequence; a prefill step's prompt tokens and a mixed step's chunk pay the roofline only."""
    ds, h200 = catalog.model("deepseek-r1"), catalog.chip("h200")
    plain = Roofline(ds, h200, 8, "mtp", efficiency=Efficiency(per_token=0.0))
    priced = Roofline(ds, h200, 8, "mtp", efficiency=Efficiency(per_token=5e-5))
    q, r, c = np.array([64, 256]), np.array([64, 64]), np.array([64_000, 64_000])
    d = np.array([0, 64])
    np.testing.assert_allclose(priced.decode(q, r, c, d, 3) - plain.decode(q, r, c, d, 3),
                               5e-5 * q, rtol=1e-9)  # fmt: skip
    assert priced.decode(256, 64, 64_000, 64, 3) - plain.decode(256, 64, 64_000, 64, 3) == (
        pytest.approx(5e-5 * 256, rel=1e-9))  # fmt: skip
    assert priced.prefill(4096, 1, 4096) == plain.prefill(4096, 1, 4096)
    np.testing.assert_allclose(priced.prefill(q, r, c), plain.prefill(q, r, c), rtol=1e-12)
    mixed = priced.mixed(256, 64, 64_000, 2048, 1, 0, 64, 3) - plain.mixed(
        256, 64, 64_000, 2048, 1, 0, 64, 3)  # fmt: skip
    assert mixed == pytest.approx(5e-5 * 256, rel=1e-9)
