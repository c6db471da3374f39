"""The roofline against step prices and KV capacities worked out by hand, from each model's
published configuration and each chip's datasheet, never from ``Shape`` or ``Roofline``:

- attention costs each sequence its own context, not the batch's total;
- multi-head latent attention (DeepSeek-V3) keeps one latent a token that every tensor-parallel
  rank holds and reads whole: tensor parallelism splits neither its reads nor its capacity;
- a Qwen3 ``config.json`` whose ``head_dim`` is not hidden / heads is read with its own.

Each figure's arithmetic is written out, so a price that moves shows which term moved.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from speclens.sim import catalog
from speclens.sim.roofline import Efficiency, Roofline

#: Datasheet figures (registry/catalog/chips): dense TFLOP/s, TB/s, GB/s of NVLink each way.
H100_BF16, H100_BANDWIDTH = 989.5e12, 3.35e12
H200_FP8, H200_BANDWIDTH, H200_MEMORY, NVLINK = 1979e12, 4.8e12, 141e9, 450e9
#: The efficiencies every price here is taken at (the defaults, written out).
COMPUTE, MEMORY, INTERCONNECT, ALL_REDUCE_LATENCY, MEMORY_USE = 0.5, 0.8, 0.7, 1e-5, 0.9
OVERHEAD, PER_SEQUENCE = 1e-3, 2e-5

# --- Llama-3.1-8B on one H100 -------------------------------------------------------------
# 32 layers, hidden 4096, 32 heads and 8 KV heads of 128, MLP 14336, vocab 128256, bf16.
#   attention a layer   2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128 = 41,943,040 parameters
#   MLP a layer         3 * 4096 * 14336                         = 176,160,768
#   LM head             128256 * 4096                            = 525,336,576
#   a token's matmuls   32 * (41,943,040 + 176,160,768) + 525,336,576 = 7,504,658,432
#   KV a token          32 layers * 2 (K, V) * 8 heads * 128 * 2 bytes = 131,072 bytes
#   attention FLOPs     32 layers * 4 * 32 heads * 128 = 524,288 per query and context token
#                       (QK^T and PV, 2 FLOPs a multiply-add each)
LLAMA_8B_MATMULS = 32 * (41_943_040 + 176_160_768) + 525_336_576
LLAMA_8B_KV, LLAMA_8B_PAIR = 131_072, 524_288


def _llama_8b_step(tokens: int, requests: int, contexts: list[int]) -> float:
    """A verify step of ``tokens`` query tokens over ``requests`` sequences whose contexts are
    ``contexts``, all alike: each query token attends to its own sequence's context."""
    assert len(contexts) == requests and len(set(contexts)) == 1
    linear = max(
        2 * LLAMA_8B_MATMULS * tokens / (H100_BF16 * COMPUTE),  # FLOPs
        2 * LLAMA_8B_MATMULS / (H100_BANDWIDTH * MEMORY),  # bf16 weights read once
    )
    attention = max(
        LLAMA_8B_PAIR * tokens * contexts[0] / (H100_BF16 * COMPUTE),
        LLAMA_8B_KV * sum(contexts) / (H100_BANDWIDTH * MEMORY),  # every sequence's KV read
    )
    return OVERHEAD + PER_SEQUENCE * requests + linear + attention


def test_attention_costs_each_sequence_its_own_context_not_the_batchs() -> None:
    """Batch 256 decoding at 4,096 tokens of context each, on Llama-3.1-8B / H100:
    linear 7.77 ms (compute: 15.0 GFLOP x 256 at 494.75 TFLOP/s), attention 51.28 ms (memory:
    256 x 4096 x 131,072 bytes = 137 GB at 2.68 TB/s; its FLOPs, 524,288 x 256 x 4096 =
    0.55 PFLOP, take 1.11 ms), overhead 1 ms + 256 x 20 us: 65.17 ms. Priced over the batch's
    1,048,576 context tokens, attention's FLOPs would be 256x, 284 ms, and the step 298 ms."""
    cost = Roofline(catalog.model("llama-3.1-8b"), catalog.chip("h100"), efficiency=Efficiency())
    assert 32 * (41_943_040 + 176_160_768) + 525_336_576 == 7_504_658_432
    assert (LLAMA_8B_KV, LLAMA_8B_PAIR) == (32 * 2 * 8 * 128 * 2, 32 * 4 * 32 * 128)

    decode = _llama_8b_step(256, 256, [4096] * 256)
    assert decode == pytest.approx(0.0651695, rel=1e-5)
    assert cost.verify(256, 256, 256 * 4096) == pytest.approx(decode, rel=1e-9)
    batch_total = LLAMA_8B_PAIR * 256 * (256 * 4096) / (H100_BF16 * COMPUTE)
    assert batch_total == pytest.approx(0.284462, rel=1e-5)  # what the wrong pricing adds

    # A prefill chunk of two prompts of 2,048 tokens each: attention is compute-bound,
    # 524,288 x 4096 x 2048 / 494.75e12 = 8.89 ms (over the batch's 4,096: 17.78 ms).
    chunk = _llama_8b_step(4096, 2, [2048, 2048])
    assert chunk == pytest.approx(0.1341905, rel=1e-5)
    assert cost.verify(4096, 2, 4096) == pytest.approx(chunk, rel=1e-9)
    # One sequence: its context is the batch's.
    assert cost.verify(1, 1, 4096) == pytest.approx(_llama_8b_step(1, 1, [4096]), rel=1e-9)


# --- DeepSeek-V3 on eight H200 (tensor parallel 8) -----------------------------------------
# 61 layers (3 dense, 58 MoE), hidden 7168, 128 heads, MLA (q_lora 1536, kv_lora 512, rope 64,
# nope 128, v 128), dense MLP 18432, 256 routed experts of 2048 (8 a token) and 1 shared,
# vocab 129280, FP8 weights (1 byte), bf16 KV cache.
#   attention a layer  q: 7168 * 1536 + 1536 * 128 * (128 + 64)   =  48,758,784
#                      kv: 7168 * (512 + 64) + 512 * 128 * (128 + 128) = 20,905,984
#                      o: 128 * 128 * 7168                         = 117,440,512
#                                                                  = 187,105,280
#   dense MLP          3 * 7168 * 18432 = 396,361,728; an expert 3 * 7168 * 2048 = 44,040,192
#   router             7168 * 256 = 1,835,008
#   every token's part 61 * 187,105,280 + 3 * 396,361,728 + 58 * (44,040,192 + 1,835,008)
#                      = 15,263,268,864 (routed experts aside)
#   LM head            129280 * 7168 = 926,679,040 (the embedding as many again)
#   routed experts     58 * 256 * 44,040,192 = 653,908,770,816
#   KV a token         61 layers * (512 + 64) * 2 bytes = 70,272 bytes: one latent and one
#                      rope key a layer, shared by all 128 heads. Tensor parallelism splits the
#                      heads, so every rank keeps and reads the whole latent of every token.
#   attention FLOPs    absorbed MLA: 61 * 2 * 128 * (2 * 512 + 64) = 16,990,208 per query and
#                      context token (scores over latent and rope, values over the latent)
DS_EVERY_TOKEN = 61 * 187_105_280 + 3 * 396_361_728 + 58 * (44_040_192 + 1_835_008)
DS_LM_HEAD, DS_EXPERT, DS_KV, DS_PAIR = 926_679_040, 44_040_192, 70_272, 16_990_208
DS_ROUTED = 58 * 256 * DS_EXPERT
DS_IDLE = Efficiency(overhead=0.0, per_sequence=0.0)


def _deepseek_forward_tp8(tokens: int, requests: int, context: int) -> float:
    """One forward at TP 8: the matmuls and the weight reads split over 8 chips, the latent KV
    read whole by each, and two ring all-reduces a layer of ``tokens`` bf16 activations."""
    chips = 8
    flops = 2 * (DS_EVERY_TOKEN + 58 * 8 * DS_EXPERT + DS_LM_HEAD)  # per token
    # Uniform routing: a layer reads the experts at least one of the tokens picks.
    touched = 256 * (1 - (1 - 8 / 256) ** tokens)
    read = DS_EVERY_TOKEN + DS_LM_HEAD + 58 * touched * DS_EXPERT  # bytes (FP8)
    linear = max(
        flops * tokens / (H200_FP8 * COMPUTE * chips), read / (H200_BANDWIDTH * MEMORY * chips)
    )
    attention = max(
        DS_PAIR * tokens * (context / requests) / (H200_FP8 * COMPUTE * chips),  # heads split
        DS_KV * context / (H200_BANDWIDTH * MEMORY),  # the latent: not divided by the chips
    )
    ring = 2 * (chips - 1) / chips * tokens * 7168 * 2 / (NVLINK * INTERCONNECT)
    return linear + attention + 2 * 61 * (ring + ALL_REDUCE_LATENCY)


def test_mla_latent_kv_is_read_whole_by_every_tensor_parallel_rank() -> None:
    """DeepSeek-V3 at TP 8 on H200, batch 64 decoding at 4,096 each: the latent KV,
    70,272 x 262,144 = 18.4 GB, takes 4.80 ms at 3.84 TB/s on each chip (split 8 ways it would
    be 0.60 ms, below attention's FLOPs, 0.56 ms); the matmuls 19.02 ms, the all-reduces
    1.84 ms: 25.66 ms."""
    attention = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert attention == 187_105_280
    assert DS_EVERY_TOKEN == 15_263_268_864
    assert (DS_KV, DS_PAIR) == (61 * 576 * 2, 61 * 2 * 128 * (2 * 512 + 64))
    cost = Roofline(catalog.model("deepseek-v3"), catalog.chip("h200"), 8, efficiency=DS_IDLE)
    step = _deepseek_forward_tp8(64, 64, 64 * 4096)
    assert step == pytest.approx(0.0256619, rel=1e-5)
    latent_read = DS_KV * 64 * 4096 / (H200_BANDWIDTH * MEMORY)
    assert latent_read == pytest.approx(0.0047972, rel=1e-5)
    for tokens, requests, context in ((64, 64, 64 * 4096), (256, 256, 256 * 4096), (1, 1, 4096)):
        expected = _deepseek_forward_tp8(tokens, requests, context)
        assert cost.verify(tokens, requests, context) == pytest.approx(expected, rel=1e-9)


def test_mla_latent_kv_capacity_is_not_split_by_tensor_parallelism() -> None:
    """DeepSeek-V3 at TP 8 on H200: each chip holds 141 GB x 0.9 = 126.9 GB, an eighth of the
    weights (671.0 GB in FP8 / 8 = 83.9 GB), and the whole 70,272-byte latent of every token:
    (126.9e9 - 83.88e9) / 70,272 = 612,218 tokens. Split 8 ways it would be 4.9 million."""
    weights = DS_EVERY_TOKEN + 2 * DS_LM_HEAD + DS_ROUTED  # bytes: FP8
    assert weights == 671_025_397_760  # the model card's 671B
    per_chip = H200_MEMORY * MEMORY_USE - weights / 8
    tokens = math.floor(per_chip / DS_KV)
    assert tokens == 612_218
    # The shipped entry without its MTP layer is exactly this architecture.
    deepseek = catalog.model("deepseek-v3")
    plain = deepseek.model_copy(update={"mtp_layers": 0})
    assert Roofline(plain, catalog.chip("h200"), 8).kv_tokens() == tokens
    # With it, the MTP layer's weights (one decoder layer: at most 15 GB, all of its experts
    # held) take a little more: never the 8x a split latent would claim.
    shipped = Roofline(deepseek, catalog.chip("h200"), 8).kv_tokens()
    assert math.floor((per_chip - 15e9 / 8) / DS_KV) <= shipped < tokens
    # GQA, by contrast, splits its KV heads: Llama-3.1-70B at TP 8 on H200 keeps
    # 327,680 / 8 = 40,960 bytes a token on each chip.
    llama = Roofline(catalog.model("llama-3.1-70b"), catalog.chip("h200"), 8)
    llama_weights = 2 * (80 * (150_994_944 + 704_643_072) + 2 * 1_050_673_152)
    llama_tokens = math.floor((H200_MEMORY * MEMORY_USE - llama_weights / 8) / (327_680 / 8))
    assert llama.kv_tokens() == llama_tokens


# --- Qwen3: head_dim is its own --------------------------------------------------------------
#: Qwen3-32B's config.json (the fields a roofline reads, as published): 64 heads of 128 in a
#: hidden size of 5120, so head_dim (128) is not hidden / heads (80).
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 25600,
    "max_position_embeddings": 40960, "num_attention_heads": 64, "num_hidden_layers": 64,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936,
}  # fmt: skip
#: Qwen3-30B-A3B's: 32 heads of 128 in 2048 (hidden / heads = 64), 128 experts of 768, 8 a token.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "head_dim": 128,
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936,
}  # fmt: skip


def _config(tmp_path: Path, name: str, config: dict[str, object]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "config.json"


def test_a_qwen3_config_is_read_with_its_own_head_dim(tmp_path: Path) -> None:
    """Qwen3-32B from its config.json:
      attention a layer  2 * 5120 * 64 * 128 + 2 * 5120 * 8 * 128 = 94,371,840 parameters
      MLP a layer        3 * 5120 * 25600 = 393,216,000
      embedding, head    151936 * 5120 each = 777,912,320
      all                64 * (94,371,840 + 393,216,000) + 2 * 777,912,320 = 32,761,446,400,
                         the card's 32.8B (with head_dim 80: 30.5B)
      KV a token         64 layers * 2 * 8 heads * 128 * 2 bytes = 262,144 bytes (80: 163,840)
    On one H200: (141 GB x 0.9 - 2 x 32,761,446,400) / 262,144 = 234,135 tokens of KV (with
    head_dim 80, 374,616)."""
    model = catalog.read_model(_config(tmp_path, "Qwen3-32B", QWEN3_32B))
    assert (model.head_dim, model.hidden_size // model.num_attention_heads) == (128, 80)
    parameters = 64 * (94_371_840 + 393_216_000) + 2 * 151936 * 5120
    assert parameters == 32_761_446_400
    cost = Roofline(model, catalog.chip("h200"))
    assert cost.weights_bytes() == 2 * parameters
    assert cost.kv_tokens() == math.floor((141e9 * 0.9 - 2 * parameters) / 262_144) == 234_135
    # A decode step of 32 at 4,096 each: it reads every weight but the embedding (a lookup),
    # 2 x (32,761,446,400 - 777,912,320) bytes, and 32 x 4096 x 262,144 bytes of KV, at
    # 3.84 TB/s; its FLOPs (2 x 31,983,534,080 x 32 at 989.5 TFLOP/s x 0.5) take 4.1 ms.
    idle = Roofline(model, catalog.chip("h200"), efficiency=DS_IDLE)
    linear = 2 * (parameters - 151936 * 5120) / (H200_BANDWIDTH * MEMORY)  # memory-bound
    attention = 262_144 * 32 * 4096 / (H200_BANDWIDTH * MEMORY)
    assert idle.verify(32, 32, 32 * 4096) == pytest.approx(linear + attention, rel=1e-9)
    assert cost.describe()["kv_cache_tokens"] == 234_135

    # Qwen3-30B-A3B: attention 2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128 = 18,874,368 a layer;
    # 128 experts of 3 * 2048 * 768 = 4,718,592 and a 2048 * 128 router; 48 layers and
    # 2 * 151936 * 2048 of embedding and head: 30,531,911,680 (its card: 30.5B; with head_dim
    # 64, 30.08B). KV: 48 * 2 * 4 * 128 * 2 = 98,304 bytes a token.
    moe = catalog.read_model(_config(tmp_path, "Qwen3-30B-A3B", QWEN3_30B_A3B))
    moe_parameters = 48 * (18_874_368 + 128 * 4_718_592 + 2048 * 128) + 2 * 151936 * 2048
    assert moe_parameters == 30_531_911_680
    moe_cost = Roofline(moe, catalog.chip("h200"))
    assert moe_cost.weights_bytes() == 2 * moe_parameters
    assert moe_cost.kv_tokens() == math.floor((141e9 * 0.9 - 2 * moe_parameters) / 98_304)


# --- GQA past its KV heads ---------------------------------------------------------------------
# Qwen3-30B-A3B has 4 KV heads: at TP 8 each rank keeps one KV head (two ranks a head), a quarter
# of the 48 * 2 * 4 * 128 * 2 = 98,304 bytes a token, not an eighth.
#   every token's part  48 * (18,874,368 attention + 2048 * 128 router) = 918,552,576
#   LM head             151936 * 2048 = 311,164,928 (the embedding as many again)
#   an expert           3 * 2048 * 768 = 4,718,592; 128 a layer, 8 a token
#   attention FLOPs     48 * 4 * 32 * 128 = 786,432 per query and context token
QWEN_MOE_EVERY_TOKEN, QWEN_MOE_LM_HEAD, QWEN_MOE_EXPERT = 918_552_576, 311_164_928, 4_718_592


def test_gqa_past_its_kv_heads_keeps_a_copy_of_one_head_a_rank(tmp_path: Path) -> None:
    """Qwen3-30B-A3B at TP 8 on H200. Capacity: each chip holds 126.9 GB, an eighth of
    61.06 GB of weights (7.63 GB), and 98,304 / 4 = 24,576 bytes of every token:
    (126.9e9 - 7.633e9) / 24,576 = 4,852,987 tokens (split 8 ways it would be twice that).
    A decode step of 64 at 4,096 each reads 24,576 x 262,144 bytes of KV on each chip."""
    assert QWEN_MOE_EVERY_TOKEN == 48 * (2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 2048 * 128)
    model = catalog.read_model(_config(tmp_path, "Qwen3-30B-A3B", QWEN3_30B_A3B))
    chips = 8
    weights = 2 * (QWEN_MOE_EVERY_TOKEN + 2 * QWEN_MOE_LM_HEAD + 48 * 128 * QWEN_MOE_EXPERT)
    assert weights == 2 * 30_531_911_680
    per_chip_kv = 48 * 2 * 4 * 128 * 2 / 4
    tokens = math.floor((H200_MEMORY * MEMORY_USE - weights / chips) / per_chip_kv)
    assert tokens == 4_852_987
    assert Roofline(model, catalog.chip("h200"), chips).kv_tokens() == tokens
    # At TP 4 the 4 KV heads split evenly: 98,304 / 4 a chip again, a quarter of the weights.
    four = math.floor((H200_MEMORY * MEMORY_USE - weights / 4) / per_chip_kv)
    assert Roofline(model, catalog.chip("h200"), 4).kv_tokens() == four

    def forward(tokens: int, requests: int, context: int) -> float:
        bf16_peak = 989.5e12
        flops = 2 * (QWEN_MOE_EVERY_TOKEN + 48 * 8 * QWEN_MOE_EXPERT + QWEN_MOE_LM_HEAD)
        touched = 128 * (1 - (1 - 8 / 128) ** tokens)
        read = 2 * (QWEN_MOE_EVERY_TOKEN + QWEN_MOE_LM_HEAD + 48 * touched * QWEN_MOE_EXPERT)
        linear = max(
            flops * tokens / (bf16_peak * COMPUTE * chips),
            read / (H200_BANDWIDTH * MEMORY * chips),
        )
        attention = max(
            786_432 * tokens * (context / requests) / (bf16_peak * COMPUTE * chips),
            per_chip_kv * context / (H200_BANDWIDTH * MEMORY),  # one KV head a chip
        )
        ring = 2 * (chips - 1) / chips * tokens * 2048 * 2 / (NVLINK * INTERCONNECT)
        return linear + attention + 2 * 48 * (ring + ALL_REDUCE_LATENCY)

    cost = Roofline(model, catalog.chip("h200"), chips, efficiency=DS_IDLE)
    kv_read = 24_576 * 64 * 4096 / (H200_BANDWIDTH * MEMORY)  # 1.68 ms, half of it split 8 ways
    assert kv_read == pytest.approx(1.6777e-3, rel=1e-4)
    for tokens, requests, context in ((64, 64, 64 * 4096), (256, 256, 256 * 4096)):
        expected = forward(tokens, requests, context)
        assert cost.verify(tokens, requests, context) == pytest.approx(expected, rel=1e-9)
