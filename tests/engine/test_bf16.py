"""bfloat16 on a CPU: oneDNN's bf16 matmul at every width where the CPU has native bf16, attention
computed in float32 (``model._attend``), packed weights made again when their data is swapped,
and ``serve --dtype``'s choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from speclens.cli.serve import resolve_dtype
from speclens.engine import Engine, EngineConfig, SamplingParams
from speclens.engine.model import PACKED_ROWS, _attend, linear, native_bf16, packed

needs_bf16 = pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bf16 matmul")


@needs_bf16
@pytest.mark.parametrize("rows", [1, 2, 5, 40, PACKED_ROWS + 1])
def test_bf16_linear_is_the_float32_product_of_the_bf16_values(rows: int) -> None:
    """Every width, one row included, takes oneDNN's bf16 kernel (float32 accumulation): the
    product of the rounded values to bf16 output rounding, and the same argmax."""
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(4096, 576, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, 576, generator=gen).to(torch.bfloat16)
    got = linear(x, weight)
    want = F.linear(x.float(), weight.float())
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 4096)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=0.1)
    assert packed(weight) is not None


@needs_bf16
def test_bf16_rows_do_not_depend_on_the_other_rows() -> None:
    """A request's values are the same whatever shares its forward (batching stays greedy-exact
    in bf16 as in float32)."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(1000, 576, generator=gen).to(torch.bfloat16)
    x = torch.randn(9, 576, generator=gen).to(torch.bfloat16)
    alone = linear(x[:1], weight)[0]
    for n in (2, 5, 9):
        assert torch.equal(linear(x[:n], weight)[0], alone)


def test_a_weight_whose_data_is_swapped_is_packed_again() -> None:
    """``module.to(dtype)`` swaps a parameter's data without moving its version: the packed copy
    must follow the data, not the object."""
    weight = torch.nn.Parameter(torch.randn(64, 32), requires_grad=False)
    first = packed(weight)
    if first is None:
        pytest.skip("this torch build has no oneDNN")
    weight.data = torch.randn(64, 32)
    second = packed(weight)
    assert second is not first
    x = torch.randn(5, 32)
    torch.testing.assert_close(linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch, q_len, masked", [(1, 1, False), (1, 5, True), (3, 4, True)])
def test_attend_equals_sdpa(batch: int, q_len: int, masked: bool) -> None:
    """Grouped-query attention as SDPA computes it (query head h reads key/value head
    h // group), with a causal mask over a longer context."""
    gen = torch.Generator().manual_seed(batch * 10 + q_len)
    heads, kv_heads, dim, length = 9, 3, 16, 12
    q = torch.randn(batch, q_len, heads, dim, generator=gen)
    keys = torch.randn(batch, length, kv_heads, dim, generator=gen)
    values = torch.randn(batch, length, kv_heads, dim, generator=gen)
    mask = None
    if masked:
        pos = torch.arange(length - q_len, length).view(1, 1, q_len, 1)
        mask = (torch.arange(length).view(1, 1, 1, length) <= pos).expand(batch, 1, -1, -1)
    want = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
        attn_mask=mask, scale=0.25, enable_gqa=True,
    ).transpose(1, 2).reshape(batch, q_len, heads * dim)  # fmt: skip
    got = _attend(q, keys, values, mask, 0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    half = _attend(q.bfloat16(), keys.bfloat16(), values.bfloat16(), mask, 0.25)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), want, rtol=0.05, atol=0.05)


def test_a_bf16_engine_generates_what_it_is_asked_for() -> None:
    """The dummy model end to end in bf16 (weights, activations and KV cache), batched and
    speculating: every request its tokens, and the batch does not change a request's."""
    from speclens.engine import SpeculativeConfig

    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, ngram_min=1, ngram_max=2)
    engine = Engine(EngineConfig(dtype="bfloat16", speculative=spec, kv_cache_tokens=4096))
    assert engine.target.lm_head.weight.dtype == torch.bfloat16
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = ["abcabcabc", "hello hello", "xyz"]
    together = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    alone = [engine.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    assert [len(t) for t in together] == [12, 12, 12]
    assert together == alone


def test_dtype_auto_picks_bf16_only_where_the_cpu_multiplies_it() -> None:
    assert resolve_dtype("auto", "cpu") == ("bfloat16" if native_bf16() else "float32")
    assert resolve_dtype("float32", "cpu") == "float32"
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"


def test_native_bf16_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from speclens.engine import model as model_module

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not model_module.native_bf16()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert model_module.native_bf16() == model_module._ONEDNN
