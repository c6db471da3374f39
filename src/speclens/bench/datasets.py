"""Prompt sets: seeded synthetic prompts (the embedded default) and Spec-Bench-shaped JSONL.

Every prompt keeps its category, so acceptance can be reported per category.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from speclens.acceptance import Problem, ValidationError

WORDS = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "for",
        "it",
        "as",
        "with",
        "was",
        "on",
        "be",
        "by",
        "at",
        "this",
        "from",
        "or",
        "an",
        "are",
        "not",
        "have",
        "had",
        "which",
        "one",
        "you",
        "were",
        "all",
        "we",
        "when",
        "there",
        "can",
        "more",
        "if",
        "out",
        "so",
        "what",
        "about",
        "time",
        "would",
        "up",
        "my",
        "into",
        "some",
        "then",
        "them",
        "she",
        "other",
        "could",
        "these",
        "two",
        "may",
        "first",
        "any",
        "like",
        "new",
        "way",
        "well",
        "also",
        "people",
        "how",
        "only",
        "over",
        "just",
        "most",
        "after",
        "year",
        "very",
        "through",
        "even",
        "good",
        "where",
        "much",
        "work",
        "before",
        "go",
        "right",
    ]
)


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str
    max_tokens: int | None = None
    id: str | None = None
    #: A trace's arrival: seconds from the run's start when this request is due.
    due: float | None = None


def random_prompts(count: int, input_len: int, output_len: int, seed: int) -> list[Prompt]:
    """``count`` prompts of about ``input_len`` words of seeded filler text, each asking for
    ``output_len`` tokens."""
    rng = random.Random(seed)
    return [
        Prompt(" ".join(rng.choice(WORDS) for _ in range(input_len)), "random", output_len, str(i))
        for i in range(count)
    ]


#: The most bytes a filler word takes in a prompt (the longest word and a space).
WORD_BYTES = max(map(len, WORDS)) + 1


def trace_prompts(path: Path) -> list[Prompt]:
    """A trace's requests (``speclens.runs.trace``: a Mooncake-style JSONL file or a run
    directory) as prompts due at their arrivals: seeded filler of the request's input length in
    words (a word is about a token), asking for its output length. Every prompt is built before
    the first request goes, so their text is bounded as a prompt file is (``MAX_DATASET_BYTES``),
    and a trace past it is refused before any is built. Raises ``TraceError``."""
    from speclens.runs.trace import TraceError, read_trace

    trace = read_trace(path)
    tokens = sum(r.input_tokens for r in trace.requests)
    if tokens * WORD_BYTES > MAX_DATASET_BYTES:
        file, field = ((path / "records.jsonl", "prompt_tokens") if trace.kind == "run"
                       else (path, "input_length"))  # fmt: skip
        raise TraceError([
            f"{file}: {field}: {len(trace.requests):,} requests ask for {tokens:,} input tokens "
            f"in all, up to {tokens * WORD_BYTES:,} bytes of prompt text (a word of filler a "
            f"token), over the {MAX_DATASET_BYTES:,} bytes a prompt set may hold: send fewer "
            "or shorter requests"
        ])  # fmt: skip
    prompts = []
    for r in trace.requests:
        rng = random.Random(r.index)
        words = " ".join(rng.choice(WORDS) for _ in range(r.input_tokens))
        prompts.append(Prompt(words, r.category, r.output_tokens, str(r.index), r.arrival))
    return prompts


#: Bounds on a prompt file: far above Spec-Bench (about 0.5 MB), small enough to hold in memory.
MAX_DATASET_BYTES = 256 * 2**20
MAX_LINE_BYTES = 4 * 2**20
MAX_PROBLEMS = 20  # reported per file; the rest are counted


def jsonl_prompts(path: Path, categories: list[str] | None = None) -> list[Prompt]:
    """Spec-Bench-shaped JSONL: ``question_id``, ``category``, ``turns`` (the first turn is the
    prompt). Every malformed line is reported, with its line number (the first
    ``MAX_PROBLEMS``); lines are split on LF only, so a JSON string may hold U+2028."""
    prompts: list[Prompt] = []
    problems: list[Problem] = []
    file = str(path)
    for number, line in _lines(path):
        if isinstance(line, Problem):
            problems.append(line)
            continue
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            problems.append(Problem(file, where, f"not JSON: {exc}"))
            continue
        if not isinstance(row, dict):
            problems.append(Problem(file, where, "expected a JSON object"))
            continue
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            problems.append(Problem(file, f"{where}.turns", "expected a non-empty list of strings"))
            continue
        category = row.get("category")
        if not isinstance(category, str) or not category:
            problems.append(Problem(file, f"{where}.category", "expected a non-empty string"))
            continue
        if categories and category not in categories:
            continue
        prompts.append(Prompt(turns[0], category, None, str(row.get("question_id", number))))
    if problems:
        if len(problems) > MAX_PROBLEMS:
            more = len(problems) - MAX_PROBLEMS
            problems = [*problems[:MAX_PROBLEMS], Problem(file, "(file)", f"{more} more problems")]
        raise ValidationError(problems)
    if not prompts:
        wanted = f" in categories {categories}" if categories else ""
        raise ValidationError([Problem(file, "(file)", f"holds no prompts{wanted}")])
    return prompts


def _lines(path: Path) -> Iterator[tuple[int, str | Problem]]:
    """``(number, text)`` per line, or ``(number, Problem)`` for a line that is not UTF-8; a file
    or line beyond the bounds stops the read with a ValidationError."""
    file = str(path)

    def refuse(where: str, what: str) -> ValidationError:
        return ValidationError([Problem(file, where, what)])

    try:
        with path.open("rb") as fh:
            total = 0
            number = 0
            while line := fh.readline(MAX_LINE_BYTES + 1):
                number += 1
                total += len(line)
                if len(line) > MAX_LINE_BYTES:
                    raise refuse(f"line {number}", f"longer than {MAX_LINE_BYTES} bytes")
                if total > MAX_DATASET_BYTES:
                    raise refuse("(file)", f"larger than {MAX_DATASET_BYTES} bytes")
                try:
                    text = line.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    what = f"not UTF-8 text (byte {line[exc.start]:#04x} at offset {exc.start})"
                    yield number, Problem(file, f"line {number}", what)
                    continue
                yield number, text.rstrip("\r\n")
    except OSError as exc:
        raise refuse("(file)", f"cannot be read: {exc}") from None


#: The orders ``sample_prompts`` takes a prompt set in (``--sampling``).
SAMPLINGS = ("category-round-robin", "shuffle", "in-order")


def sample_prompts(prompts: list[Prompt], sampling: str, seed: int) -> list[Prompt]:
    """``prompts`` in the order a run sends them. ``category-round-robin``: each category's
    prompts shuffled (seeded), then one of each category in turn (the categories in a seeded
    order), so the first requests cover every category; ``shuffle``: all of them shuffled
    (seeded); ``in-order``: as the file has them. Raises ValueError on another name."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling: expected one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    if sampling == "in-order":
        return list(prompts)
    rng = random.Random(seed)
    if sampling == "shuffle":
        out = list(prompts)
        rng.shuffle(out)
        return out
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    order = list(groups)
    rng.shuffle(order)
    for name in order:
        rng.shuffle(groups[name])
    out = []
    for turn in range(max(len(g) for g in groups.values()) if groups else 0):
        out.extend(groups[name][turn] for name in order if turn < len(groups[name]))
    return out
