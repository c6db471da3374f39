"""Probabilistic speculative sampling preserves the target's distribution, end to end.

At temperature 0.8 the engine samples each request (its own seed) with and without speculation;
the tokens at output positions 2, 3 and 4 (those the first verify step decides: accepted drafts,
corrections, none of them the prefill's token) must follow the same distribution in both runs.
The models are tiny (vocabulary 8) with peaked, unrelated output layers, so the drafter is often
wrong and rejections happen; a drafter whose every draft is accepted would shift the marginals to
its own, which the same test must flag.

The check is Pearson's chi-square test of homogeneity per position (2 x V table): under H0 the
statistic is asymptotically chi-square with V' - 1 degrees of freedom (V' columns after pooling
those with an expected count below 5). Three positions at a family-wise false-alarm rate of
ALPHA = 0.001 (Bonferroni): each p-value must exceed ALPHA / 3. The seeds are fixed, so the
outcome is deterministic; the rate says how unlucky a fixed seed set would have to be.
"""

from __future__ import annotations

import pytest
import torch

from enginekit import config
from speclens.engine import Engine, SamplingParams, SpeculativeConfig
from speclens.engine.model import LlamaModel, ModelConfig
from speclens.engine.tokenizer import ByteTokenizer
from speclens.engine.weights_dummy import dummy_model

VOCAB = 8
K = 3
POSITIONS = (2, 3, 4)  # 1-based output positions; position 1 comes from the prefill
NUM_SEQUENCES = 3000  # per run
ALPHA = 0.001  # family-wise, over the three positions
PROMPT = [1, 5, 2, 7]
TINY = ModelConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
)
#: The output layer's scale: normed hidden states of width 32 give logits of standard deviation
#: about 0.35 * sqrt(32) = 2, peaked enough that target and drafter disagree often.
HEAD_STD = 0.35


def tiny_model(seed: int) -> LlamaModel:
    model = dummy_model(TINY, seed)
    gen = torch.Generator().manual_seed(seed + 1000)  # not dummy_model's stream: untied draws
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, HEAD_STD, generator=gen)
    return model


def sample(speculative: bool, first_seed: int) -> tuple[torch.Tensor, Engine]:
    """Output tokens [NUM_SEQUENCES, len(POSITIONS)] at ``POSITIONS``, one seeded request each,
    and the engine that produced them."""
    spec = (
        SpeculativeConfig(method="draft_model", num_speculative_tokens=K) if speculative else None
    )
    engine = Engine(
        config(spec, detokenize=False, max_num_seqs=512, max_model_len=32),
        target=tiny_model(0),
        draft=tiny_model(1) if speculative else None,
        tokenizer=ByteTokenizer(),
    )
    params = [
        SamplingParams(
            max_tokens=max(POSITIONS), temperature=0.8, seed=first_seed + i, ignore_eos=True
        )
        for i in range(NUM_SEQUENCES)
    ]
    outs = engine.generate([PROMPT] * NUM_SEQUENCES, params)
    tokens = torch.tensor([out.outputs[0].token_ids for out in outs])
    return tokens[:, [p - 1 for p in POSITIONS]], engine


def homogeneity_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson chi-square test that two samples of token ids come from one distribution.

    Columns whose expected count (in either row) is below 5 are pooled into one, which keeps the
    chi-square approximation sound; df = columns - 1 for a 2-row table.
    """
    counts = torch.stack(
        [torch.bincount(a, minlength=VOCAB), torch.bincount(b, minlength=VOCAB)]
    ).to(torch.float64)
    rows, cols = counts.sum(dim=1, keepdim=True), counts.sum(dim=0)
    sparse = (rows.min() * cols / counts.sum()) < 5
    if sparse.any():
        counts = torch.cat([counts[:, ~sparse], counts[:, sparse].sum(dim=1, keepdim=True)], 1)
        counts = counts[:, counts.sum(dim=0) > 0]
    rows, cols = counts.sum(dim=1, keepdim=True), counts.sum(dim=0, keepdim=True)
    expected = rows * cols / counts.sum()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    df = torch.tensor((counts.shape[1] - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, chi2 / 2))


def pvalues(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    return [homogeneity_pvalue(a[:, i], b[:, i]) for i in range(len(POSITIONS))]


@pytest.fixture(scope="module")
def plain() -> torch.Tensor:
    """Without speculation: seeds 0..N-1 (the speculative runs use other seeds, so the two
    samples are independent)."""
    return sample(False, first_seed=0)[0]


def test_speculation_preserves_the_distribution(plain: torch.Tensor) -> None:
    spec, engine = sample(True, first_seed=NUM_SEQUENCES)
    stats = engine.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, "no rejections happened"
    p = pvalues(plain, spec)
    assert min(p) > ALPHA / len(POSITIONS), f"p-values {p}"


def test_accepting_every_draft_is_flagged(
    plain: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same check has power: with acceptance broken to keep every real draft, the tokens at
    positions 2..4 follow the drafter, and at least one position is rejected."""
    import speclens.sampling.rejection as rejection

    monkeypatch.setattr(
        rejection, "_num_accepted", lambda accept, num_draft_tokens: num_draft_tokens
    )
    broken, _ = sample(True, first_seed=NUM_SEQUENCES)
    p = pvalues(plain, broken)
    assert min(p) < ALPHA / len(POSITIONS), f"p-values {p}"
