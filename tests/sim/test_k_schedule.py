"""The K schedule's parts: ``--context`` lengths, the roofline's decode terms (they add up to its
price), best K and its gain over no speculation by concurrency x context, the term named where
K loses at long context, and the engine flags one line per distinct K."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speclens.acceptance.emit import EmitRefused
from speclens.sim import schedule as sc
from speclens.sim.scenario import load_scenario, roofline

EXAMPLE = Path(__file__).parents[2] / "examples" / "kimi-k3-dspark.yaml"


def test_context_lengths_read_k_as_1024_and_plain_counts() -> None:
    assert sc.parse_contexts("8k,1k, 32k") == [1024, 8192, 32768]
    assert sc.parse_contexts("1000,2K") == [1000, 2048]
    assert sc.tokens(32768) == "32k" and sc.tokens(1000) == "1000"
    for bad in ("", "1x", "0k", "-1", "1k,1024"):
        with pytest.raises(ValueError):
            sc.parse_contexts(bad)
    with pytest.raises(ValueError, match="9 context lengths, over the limit of 8"):
        sc.parse_contexts(",".join(str(i) for i in range(1, 10)))


def test_the_terms_add_up_to_the_decode_price_at_every_k_and_context() -> None:
    scenario = load_scenario(EXAMPLE, None)
    roof = roofline(scenario, scenario.deployment.pools[0], EXAMPLE.parent)
    for k in (1, 4, 8):
        for batch, context in ((8, 1024), (64, 32768)):
            args = (batch * (k + 1), batch, batch * context, batch, k)
            terms = roof.terms(*args)
            assert set(terms) == {"verify_width", "kv_reads", "drafter"}
            assert sum(terms.values()) == pytest.approx(float(roof.decode(*args)), rel=1e-9)
            assert all(v > 0 for v in terms.values())
    # KV reads grow with the context; verify width does not.
    short, long = roof.terms(40, 8, 8 * 1024, 8, 4), roof.terms(40, 8, 8 * 32768, 8, 4)
    assert long["kv_reads"] > 10 * short["kv_reads"]
    assert long["verify_width"] == short["verify_width"]


def _row(out_tok_s: float, tpot_ms: float = 20.0) -> dict[str, Any]:
    return {"throughput": {"output_tokens_per_s": out_tok_s}, "latency_ms": {"tpot": {"mean": tpot_ms}},
            "resolution": {"acceptance_length": 2.0}}  # fmt: skip


def _points() -> list[tuple[int, int, int, dict[str, Any]]]:
    # (context, K, concurrency) -> output tok/s on 2 GPUs.
    table = {
        (1024, 0, 8): 100, (1024, 2, 8): 150, (1024, 4, 8): 180,
        (8192, 0, 8): 100, (8192, 2, 8): 130, (8192, 4, 8): 120,
        (1024, 0, 64): 400, (1024, 2, 64): 500, (1024, 4, 64): 440,
        (8192, 0, 64): 300, (8192, 2, 64): 290, (8192, 4, 64): 280,
    }  # fmt: skip
    return [(c, k, n, _row(v)) for (c, k, n), v in table.items()]


def test_best_k_and_gain_over_no_speculation_by_concurrency_and_context() -> None:
    sched = sc.schedule(_points(), gpus=2)
    assert sched["contexts"] == [1024, 8192]
    cells = {(r["concurrency"], c["context"]): c for r in sched["rows"] for c in r["cells"]}
    assert (cells[8, 1024]["num_spec_tokens"], cells[8, 1024]["gain"]) == (4, pytest.approx(0.8))
    assert (cells[8, 8192]["num_spec_tokens"], cells[8, 8192]["gain"]) == (2, pytest.approx(0.3))
    assert (cells[64, 1024]["num_spec_tokens"], cells[64, 1024]["gain"]) == (2, pytest.approx(0.25))
    # No K beats no speculation: K 0 wins, with no gain.
    assert cells[64, 8192]["num_spec_tokens"] == 0 and cells[64, 8192]["gain"] == 0
    assert cells[8, 1024]["tok_s_gpu"] == 90.0
    assert [sc.cell_text(cells[k]) for k in ((8, 1024), (64, 8192))] == ["K 4 +80%", "K 0"]


class _Roof:
    """A decode step: verify width grows with K, KV reads with K and the context."""

    def terms(self, q: float, r: float, c: float, d: float, k: int) -> dict[str, float]:
        return {"verify_width": 1e-3 * q / r, "kv_reads": 1e-9 * c * (k + 1), "drafter": 1e-4 * k}


def test_the_term_that_makes_k_lose_at_long_context_is_named() -> None:
    sched = sc.schedule(_points(), gpus=2)
    losses = sc.attribute(sched, _Roof(), fallback_batch=8)
    # Concurrency 8: K 4 at 1k, K 2 at 8k. Concurrency 64: K 2, then K 0.
    assert [(x["concurrency"], x["from_k"], x["to_k"], x["term"]) for x in losses] == [
        (8, 4, 2, "kv_reads"), (64, 2, 0, "kv_reads")
    ]  # fmt: skip
    # K 4 minus K 2's KV reads: 1e-9 * 8 * context * 2, grown from 1k to 8k.
    assert losses[0]["growth_s"]["kv_reads"] == pytest.approx(1e-9 * 8 * (8192 - 1024) * 2)
    assert losses[0]["growth_s"]["verify_width"] == pytest.approx(0.0)
    assert losses[0]["line"].startswith("at 8k context, concurrency 8, K 4 loses to K 2: KV reads")


def test_engine_flags_one_line_per_distinct_k() -> None:
    assert sc.flags("vllm", "dspark", 4) == (
        '--speculative-config \'{"method": "dspark", "num_speculative_tokens": 4}\''
    )
    assert sc.flags("sglang", "eagle3", 3) == (
        "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 4"
    )
    assert sc.flags("trtllm", "mtp", 2) == "speculative_config: {max_draft_len: 2}"
    assert sc.flags("atom", "mtp", 2) == "--method mtp --num-speculative-tokens 2"
    assert "no speculative flags" in sc.flags("vllm", "mtp", 0)
    with pytest.raises(ValueError):
        sc.flags("tgi", "mtp", 2)
    lines = sc.emit_lines(sc.schedule(_points(), gpus=2), "atom", "mtp")
    assert lines[0].startswith("atom serves one K a server: the schedule wants 3")
    assert lines[1:] == [
        "atom: (no speculative flags: serve without speculation)  # 8k: concurrency 64",
        "atom: --method mtp --num-speculative-tokens 2  # 1k: concurrency 64; 8k: concurrency 8",
        "atom: --method mtp --num-speculative-tokens 4  # 1k: concurrency 8",
    ]


def test_vllm_takes_k_by_batch_size_one_server_per_context() -> None:
    sched = sc.schedule(_points(), gpus=2)
    assert sc.batch_ranges(sched, 0) == [[1, 8, 4], [9, 64, 2]]
    assert sc.batch_ranges(sched, 1) == [[1, 8, 2], [9, 64, 0]]
    lines = sc.emit_lines(sched, "vllm", "mtp")
    assert lines[0].startswith("vllm picks K by batch size, not by context")
    assert lines[1] == (
        'vllm: --speculative-config \'{"method": "mtp", "num_speculative_tokens": 4, '
        '"num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 2]]}\'  # 1k'
    )
    assert lines[2].endswith("[[1, 8, 2], [9, 64, 0]]}'  # 8k")


def test_sglang_flags_turn_speculation_on_with_the_methods_algorithm() -> None:
    """SGLang serves no speculation without ``--speculative-algorithm``: every line for K > 0
    names it (an MTP head runs as EAGLE), DSpark takes K as its block size, n-gram as a chain
    of K + 1 draft tokens, and a method SGLang has no name for is refused."""
    chain = "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    assert sc.flags("sglang", "mtp", 3) == f"--speculative-algorithm EAGLE {chain}"
    assert sc.flags("sglang", "eagle", 3) == f"--speculative-algorithm EAGLE {chain}"
    assert sc.flags("sglang", "draft_model", 3) == f"--speculative-algorithm STANDALONE {chain}"
    assert sc.flags("sglang", "dspark", 5) == (
        "--speculative-algorithm DSPARK --speculative-dspark-block-size 5 "
        "--speculative-num-draft-tokens 6"
    )
    assert sc.flags("sglang", "ngram", 4) == (
        "--speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 1 "
        "--speculative-num-draft-tokens 5"
    )
    assert "speculative" not in sc.flags("sglang", "mtp", 0).replace("no speculative flags", "")
    with pytest.raises(EmitRefused, match="sglang: --speculative-algorithm has a name for"):
        sc.flags("sglang", "medusa", 2)
    lines = sc.emit_lines(sc.schedule(_points(), gpus=2), "sglang", "eagle3")
    assert all("--speculative-algorithm EAGLE3" in line for line in lines
               if line.startswith("sglang: --"))  # fmt: skip
    assert lines[-1] == ("note: sglang: --speculative-algorithm EAGLE3 also needs "
                         "--speculative-draft-model-path")  # fmt: skip


def test_vllm_gets_one_line_when_every_context_shares_it() -> None:
    """Two contexts with the same K by batch size are one vLLM server: one line naming both,
    no "one server per context" header; a context that differs gets its own line."""
    same = [(c, k, n, _row(v)) for c in (1024, 8192)
            for (k, n), v in {(0, 8): 100, (2, 8): 150, (0, 64): 400, (2, 64): 300}.items()]  # fmt: skip
    lines = sc.emit_lines(sc.schedule(same, gpus=2), "vllm", "mtp")
    assert lines == [
        'vllm: --speculative-config \'{"method": "mtp", "num_speculative_tokens": 2, '
        '"num_speculative_tokens_per_batch_size": [[1, 8, 2], [9, 64, 0]]}\'  # 1k, 8k'
    ]
    three = same + [(32768, k, n, _row(v)) for (k, n), v in
                    {(0, 8): 100, (2, 8): 90, (0, 64): 400, (2, 64): 300}.items()]  # fmt: skip
    lines = sc.emit_lines(sc.schedule(three, gpus=2), "vllm", "mtp")
    assert lines[0].startswith("vllm picks K by batch size, not by context")
    assert lines[1].endswith("# 1k, 8k")
    assert lines[2] == "vllm: (no speculative flags: serve without speculation)  # 32k"
    assert len(lines) == 3


def test_a_context_that_keeps_k_names_no_term() -> None:
    same = [(c, k, 8, _row(v)) for c in (1024, 8192) for k, v in ((0, 100), (2, 150), (4, 180))]
    assert sc.attribute(sc.schedule(same, gpus=2), _Roof(), fallback_batch=8) == []


def test_the_example_takes_the_docs_longest_context() -> None:
    """docs/sim.md shows ``--context 1k,8k,32k`` on the example: 32k of input plus its longest
    output fits the pool's max_model_len (else the command exits 1)."""
    scenario = load_scenario(EXAMPLE, None)
    fitted = sc.with_context(scenario, sc.parse_contexts("32k")[0])
    longest = fitted.workload.output_tokens.max
    for pool in fitted.deployment.pools:
        assert 32 * 1024 + longest <= pool.engine.max_model_len
