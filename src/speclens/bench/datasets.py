"""Prompt sets: seeded synthetic prompts (the embedded default) and Spec-Bench-shaped JSONL.

Every prompt keeps its category, so acceptance can be reported per category.
"""

from __future__ import annotations

import random
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


def random_prompts(count: int, input_len: int, output_len: int, seed: int) -> list[Prompt]:
    """``count`` prompts of about ``input_len`` words of seeded filler text, each asking for
    ``output_len`` tokens."""
    rng = random.Random(seed)
    return [
        Prompt(" ".join(rng.choice(WORDS) for _ in range(input_len)), "random", output_len, str(i))
        for i in range(count)
    ]


def jsonl_prompts(path: Path, categories: list[str] | None = None) -> list[Prompt]:
    """Spec-Bench-shaped JSONL: ``question_id``, ``category``, ``turns`` (the first turn is the
    prompt). Every malformed line is reported, with its line number."""
    prompts: list[Prompt] = []
    problems: list[Problem] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValidationError([Problem(str(path), "(file)", f"cannot be read: {exc}")]) from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            problems.append(Problem(str(path), where, f"not JSON: {exc}"))
            continue
        if not isinstance(row, dict):
            problems.append(Problem(str(path), where, "expected a JSON object"))
            continue
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            problems.append(
                Problem(str(path), f"{where}.turns", "expected a non-empty list of strings")
            )
            continue
        category = row.get("category")
        if not isinstance(category, str) or not category:
            problems.append(Problem(str(path), f"{where}.category", "expected a non-empty string"))
            continue
        if categories and category not in categories:
            continue
        prompts.append(Prompt(turns[0], category, None, str(row.get("question_id", number))))
    if problems:
        raise ValidationError(problems)
    if not prompts:
        wanted = f" in categories {categories}" if categories else ""
        raise ValidationError([Problem(str(path), "(file)", f"holds no prompts{wanted}")])
    return prompts
