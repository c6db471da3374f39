"""A decode step's seconds by batch width and by whether it verified drafts: attention on the
padded layout (every request as wide as the widest draft and as long as the longest context)
against attention request by request (``ForwardBatch.segments``).

SmolLM2 with n-gram drafting at K 4 (prompt lookup 2..4), greedy, 64 tokens, ignore-eos, the
first turns of Spec-Bench prompts with the chat template; the engine in this process, default
torch threads. Each round runs concurrency 1, 4 and 8 (that many requests submitted together)
once with the padded layout forced and once request by request wherever a batch has more than
one request, the two in turns, which goes first alternating by round. A batch of one attends
the same way in both, so its ratio is the run's own noise. The engine chooses between
them by ``MAX_ATTENTION_PADDING``; this forces each.

    python benchmarks/attention_layout.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from step_widths import smollm2_ngram

import speclens.engine.batch as batch_module

#: The layouts compared, by the padding limit that forces each.
LAYOUTS = {"padded": float("inf"), "request by request": 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    engine, params, texts = smollm2_ngram()
    seconds: dict[str, dict[tuple[int, str], list[float]]] = {k: defaultdict(list) for k in LAYOUTS}
    for round_ in range(args.rounds):
        # Each round in the other order: whichever runs second in a round can find the machine
        # in another state (the scratch run of this comparison, always padded first, timed the
        # same batch-of-one steps 5% to 11% slower the second time).
        turns = list(LAYOUTS.items())
        for layout, limit in turns if round_ % 2 == 0 else turns[::-1]:
            batch_module.MAX_ATTENTION_PADDING = limit
            for concurrency in (1, 4, 8):
                first = len(engine.steps)
                start = round_ * concurrency % len(texts)
                engine.generate((texts[start:] + texts)[:concurrency], params)
                for s in engine.steps[first:]:
                    if s.kind == "decode":
                        drafted = "drafts" if s.query_tokens > s.num_requests else "no drafts"
                        seconds[layout][(s.num_requests, drafted)].append(s.seconds)
    padded, own = seconds.values()
    print("| batch width | step | padded | request by request | ratio | steps each |")
    print("|---:|---|---:|---:|---:|---:|")
    for key in sorted(set(padded) & set(own)):
        if min(len(padded[key]), len(own[key])) >= 5:
            a, b = statistics.median(padded[key]), statistics.median(own[key])
            print(f"| {key[0]} | {key[1]} | {a * 1e3:.1f} ms | {b * 1e3:.1f} ms | {b / a:.3f} "
                  f"| {len(padded[key])} |")  # fmt: skip


if __name__ == "__main__":
    main()
