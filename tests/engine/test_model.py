"""LlamaModel against transformers' LlamaForCausalLM, loaded from the same saved directory: a full
prefill, then incremental decoding through the paged KV pool (single tokens and a K+1 verify
chunk), two requests of different lengths padded into one batch, blocks scattered in the pool."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from speclens.engine.model import (
    ForwardBatch,
    KVPool,
    LlamaModel,
    ModelConfig,
    lazy_zeros,
    parameter_shapes,
)
from speclens.engine.weights_dummy import dummy_model
from speclens.engine.weights_hf import load_hf_dir, save_hf_dir

transformers = pytest.importorskip("transformers")

BLOCK = 4
TOL = 1e-4


def tiny_config(tie: bool, rope_scaling: dict[str, object] | None = None) -> ModelConfig:
    config = ModelConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        rope_theta=5000.0,  # not the default, so a loader that drops it is caught
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
    )
    if rope_scaling is not None:
        config.extra["rope_scaling"] = rope_scaling
    return config


LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

CASES = {
    "tied": (True, None),
    "untied": (False, None),
    "llama3-rope": (True, LLAMA3_SCALING),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(our model loaded by load_hf_dir, transformers' model) from one saved directory."""
    tie, scaling = CASES[request.param]
    directory: Path = tmp_path_factory.mktemp(request.param)
    save_hf_dir(dummy_model(tiny_config(tie, scaling), seed=3), directory)
    ours = load_hf_dir(directory)
    theirs = transformers.LlamaForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return ours, theirs


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 96, (n,), generator=g).tolist() for n in (13, 9)]


def reference_logits(hf: torch.nn.Module, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([seq])).logits[0].float()


class Pager:
    """Hand-built ForwardBatch construction over a block table whose blocks are not contiguous."""

    def __init__(self, model: LlamaModel, lengths: list[int]) -> None:
        per_request = [-(-n // BLOCK) for n in lengths]
        num_blocks = sum(per_request) + 2
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
        self.tables: list[list[int]] = []
        for n in per_request:
            self.tables.append(order[:n])
            order = order[n:]
        self.model = model
        self.kv = KVPool(
            model.config, model.num_layers, num_blocks, BLOCK, torch.float32, torch.device("cpu")
        )

    def slot(self, request: int, position: int) -> int:
        return self.tables[request][position // BLOCK] * BLOCK + position % BLOCK

    def forward(self, chunks: list[list[int]], starts: list[int]) -> torch.Tensor:
        """Feed each request's ``chunk`` at positions ``start..``; logits [B, Q, V]."""
        b, q = len(chunks), max(len(c) for c in chunks)
        lengths = [s + len(c) for s, c in zip(starts, chunks, strict=True)]
        width = max(lengths)
        ids = torch.zeros(b, q, dtype=torch.long)
        positions = torch.zeros(b, q, dtype=torch.long)
        write = torch.full((b, q), self.kv.scratch_slot, dtype=torch.long)
        read = torch.full((b, width), self.kv.scratch_slot, dtype=torch.long)
        for r, (chunk, start) in enumerate(zip(chunks, starts, strict=True)):
            for i, token in enumerate(chunk):
                ids[r, i], positions[r, i] = token, start + i
                write[r, i] = self.slot(r, start + i)
            for j in range(lengths[r]):
                read[r, j] = self.slot(r, j)
        keys = torch.arange(width)
        mask = (keys[None, None, :] <= positions[:, :, None]) & (
            keys[None, None, :] < torch.tensor(lengths)[:, None, None]
        )
        batch = ForwardBatch(ids, positions, write, read, mask[:, None])
        with torch.no_grad():
            return self.model.logits(self.model(batch, self.kv))


def test_prefill_matches_transformers(pair, sequences) -> None:
    ours, theirs = pair
    pager = Pager(ours, [len(s) for s in sequences])
    logits = pager.forward(sequences, [0, 0])
    for r, seq in enumerate(sequences):
        expected = reference_logits(theirs, seq)
        torch.testing.assert_close(logits[r, : len(seq)], expected, atol=TOL, rtol=0)


def test_incremental_decoding_matches_transformers(pair, sequences) -> None:
    """Prefill, one token, a verify chunk (K+1 = 4 and 3), one token, the rest: every real query
    position's logits equal the full-sequence reference at that position."""
    ours, theirs = pair
    expected = [reference_logits(theirs, seq) for seq in sequences]
    pager = Pager(ours, [len(s) for s in sequences])
    schedule = [(5, 3), (1, 1), (4, 3), (1, 1), (2, 1)]
    done = [0, 0]
    for sizes in schedule:
        chunks = [seq[d : d + n] for seq, d, n in zip(sequences, done, sizes, strict=True)]
        logits = pager.forward(chunks, done)
        for r, n in enumerate(sizes):
            torch.testing.assert_close(
                logits[r, :n], expected[r][done[r] : done[r] + n], atol=TOL, rtol=0
            )
        done = [d + n for d, n in zip(done, sizes, strict=True)]
    assert done == [len(s) for s in sequences]


def test_loads_a_directory_transformers_saved(pair, sequences, tmp_path: Path) -> None:
    """A checkpoint in transformers' own (v5: rope_parameters) format loads to the same model."""
    ours, theirs = pair
    theirs.save_pretrained(tmp_path)
    reloaded = load_hf_dir(tmp_path)
    assert reloaded.config.rope_theta == ours.config.rope_theta == 5000.0
    assert reloaded.config.extra == ours.config.extra
    assert torch.equal(
        Pager(reloaded, [13]).forward(sequences[:1], [0]),
        Pager(ours, [13]).forward(sequences[:1], [0]),
    )


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux's /proc")
def test_a_kv_pool_reads_zero_and_holds_only_what_is_written() -> None:
    """A pool sized for the worst case must not fill (seconds) nor hold (gigabytes) memory that
    no request ever writes: 2 GiB of slots, one written."""
    config = ModelConfig(
        vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=4,
    )  # fmt: skip
    block_size = 16
    # 8 layers x 4 heads x 16 dims x 4 bytes a slot: 1 GiB each for k and v
    num_blocks = 2**30 // (8 * 4 * 16 * 4 * block_size)
    before = _resident_bytes()
    kv = KVPool(config, 8, num_blocks, block_size, torch.float32, torch.device("cpu"))
    assert kv.k.shape == (8, num_blocks * block_size + 1, 4, 16)
    assert _resident_bytes() - before < 64 * 2**20
    kv.k[3, 12345] = 1.0
    assert kv.k[3, 12345].sum() == 4 * 16
    assert kv.k[3, 12344].abs().sum() == 0 and kv.v[7, -1].abs().sum() == 0
    assert int(kv.k.count_nonzero()) == 4 * 16


def test_lazy_zeros_read_zero_on_memory_just_freed() -> None:
    """Kills the mutation ``lazy_zeros`` -> ``torch.empty``: fresh pages read zero whatever
    allocated them (the 2 GiB pool above passes with ``torch.empty``), so this fills memory with
    garbage, frees it and asks for the same sizes, which an allocator serves from that memory."""
    for count in (16, 1000, 64 * 1024, 1 << 20):
        garbage = [torch.full((count,), 7.0) for _ in range(8)]
        del garbage
        fresh = [lazy_zeros((count,), torch.float32, torch.device("cpu")) for _ in range(8)]
        assert all(int(t.count_nonzero()) == 0 for t in fresh), count
        assert all(t.shape == (count,) and t.dtype == torch.float32 for t in fresh)


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_shapes_are_the_models(tie: bool) -> None:
    """Loaders check a file against ``parameter_shapes`` before building: it must be exactly
    what ``LlamaModel`` holds."""
    config = tiny_config(tie)
    with torch.device("meta"):
        model = LlamaModel(config)
    held = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert parameter_shapes(config) == held
