"""bfloat16 on a CPU: oneDNN's bf16 matmul at every width where the CPU has native bf16, attention
computed in float32 over a float32 cache, packed weights made again when their
data is swapped, and ``serve --dtype``'s choice."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from speclens.cli.serve import resolve_dtype
from speclens.engine import Engine, EngineConfig, SamplingParams
from speclens.engine.batch import build_batch
from speclens.engine.executor import TorchExecutor
from speclens.engine.model import (
    PACKED_ROWS,
    KVPool,
    LlamaModel,
    ModelConfig,
    linear,
    native_bf16,
    packed,
)

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
    pack = packed(weight)
    assert pack is not None
    if rows <= PACKED_ROWS:  # oneDNN's kernel on the packed weight, one and two rows included
        onednn = torch.ops.mkldnn._linear_pointwise(x, pack, None, "none", [None], "")
        assert torch.equal(got, onednn)
        with torch.profiler.profile() as prof:
            linear(x, weight)
        assert "mkldnn::_linear_pointwise" in {e.name for e in prof.events()}


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


@pytest.mark.parametrize("widths", [[1], [5], [3, 1, 2]])
def test_bf16_attends_in_float32_over_a_float32_cache(widths: list[int]) -> None:
    """bf16 queries over a float32 cache (as ``Engine`` keeps it on a CPU): the forward runs,
    writes float32 keys and values, and its hidden states are float32's to bf16 rounding, one
    request or several of unequal widths."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    full = LlamaModel(config).eval()
    half = copy.deepcopy(full).to(torch.bfloat16)
    cpu = torch.device("cpu")
    tokens = [[(7 * b + i) % 64 for i in range(12 + n)] for b, n in enumerate(widths)]
    tables = [[4 * b, 4 * b + 1, 4 * b + 2] for b in range(len(widths))]
    starts = [0] * len(widths)
    outs = []
    for model in (full, half):
        kv = KVPool(config, 2, 4 * len(widths), 8, torch.float32, cpu)
        batch = build_batch(tables, starts, tokens, 8, kv.scratch_slot, cpu)
        with torch.inference_mode():
            outs.append(model(batch, kv).float())
        assert kv.k.dtype == torch.float32 and bool(kv.k.abs().sum() > 0)
    torch.testing.assert_close(outs[1], outs[0], rtol=0.05, atol=0.1)


def test_a_bf16_engine_generates_what_it_is_asked_for() -> None:
    """The dummy model end to end in bf16 (weights, activations and KV cache), batched and
    speculating: every request its tokens, and the batch does not change a request's."""
    from speclens.engine import SpeculativeConfig

    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, ngram_min=1, ngram_max=2)
    engine = Engine(EngineConfig(dtype="bfloat16", speculative=spec, kv_cache_tokens=4096))
    assert engine.target.lm_head.weight.dtype == torch.bfloat16
    assert isinstance(engine.executor, TorchExecutor)
    assert engine.executor.kv.k.dtype == torch.float32  # the cache stays float32 on a CPU
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = ["abcabcabc", "hello hello", "xyz"]
    together = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    alone = [engine.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    assert [len(t) for t in together] == [12, 12, 12]
    assert together == alone


def test_dtype_auto_picks_bf16_only_where_the_cpu_multiplies_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from speclens.engine import model as model_module

    assert resolve_dtype("auto", "cpu") == ("bfloat16" if native_bf16() else "float32")
    for native in (False, True):
        monkeypatch.setattr(model_module, "native_bf16", lambda native=native: native)
        assert resolve_dtype("auto", "cpu") == ("bfloat16" if native else "float32")
        assert resolve_dtype("float32", "cpu") == "float32"
        assert resolve_dtype("bfloat16", "cpu") == "bfloat16"


def test_native_bf16_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from speclens.engine import model as model_module

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not model_module.native_bf16()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert model_module.native_bf16() == model_module._ONEDNN
