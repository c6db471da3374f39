"""The two error types of ``speclens.acceptance``.

``ValidationError`` is raised for anything that is not a valid acceptance value, profile set, pin
or file; it carries every problem found, each as ``<file>: <path.to.field>: <what is wrong>``.
``ResolutionRefused`` (and one subclass per refusal of the seed) is raised when a lookup cannot
pick exactly one value. Nothing falls back silently.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: How every unrecognized key is reported; a message may go on to say which keys are expected.
UNRECOGNIZED_KEY = "is not a recognized key"


@dataclass(frozen=True)
class Problem:
    """One thing wrong, located by file (may be empty) and dotted field path (may be empty)."""

    file: str
    path: str
    message: str

    def __str__(self) -> str:
        parts = [p for p in (self.file, self.path) if p]
        return ": ".join([*parts, self.message])


class ValidationError(ValueError):
    """Invalid acceptance data. ``problems`` lists every problem found, one per line in ``str``."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: list[Problem] = list(problems)
        if not self.problems:
            raise ValueError("ValidationError needs at least one problem")
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(cls, path: str, message: str, file: str = "") -> ValidationError:
        return cls([Problem(file, path, message)])


class ResolutionRefused(LookupError):
    """The resolver could not pick exactly one acceptance value; the message says what is missing."""


class NoThinkingMode(ResolutionRefused):
    """The workload states no thinking mode, so no profile can be looked up."""


class NoCategory(ResolutionRefused):
    """The workload states no category and no fallback category was requested."""


class NoMatchingProfile(ResolutionRefused):
    """No profile matches the key (nor the fallback category's key, when one was requested)."""


class AmbiguousProfile(ResolutionRefused):
    """Two registry sets both hold a profile for the key."""


class UnknownProfileSet(ResolutionRefused):
    """The scenario names a profile set that was not supplied."""


class WrongNumSpecTokens(ResolutionRefused):
    """A value was stated for a K other than the deployment's; it is refused, never rescaled."""
