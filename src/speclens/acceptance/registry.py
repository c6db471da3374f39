"""The registry: directories whose ``acceptance/<name>.yaml`` files are acceptance-profile sets.

The registry shipped inside the package is the default; ``--registry DIR`` adds a user's own. A
set is known by its file name, which is what a scenario's ``acceptance.profiles`` names.
"""

from __future__ import annotations

import logging
import reprlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from speclens.acceptance.errors import Problem, ValidationError
from speclens.acceptance.files import inside, load
from speclens.acceptance.schema import AcceptanceProfileSet, Profile, ProfileKey

log = logging.getLogger(__name__)

ACCEPTANCE_DIR = "acceptance"


def shipped_registry() -> Path:
    """The registry directory that ships with speclens (package data)."""
    return Path(str(resources.files("speclens") / "registry"))


@dataclass(frozen=True)
class RegisteredSet:
    """A validated profile set and the file it came from."""

    name: str
    path: Path
    profile_set: AcceptanceProfileSet


def set_files(path: Path) -> list[Path]:
    """The profile-set files a path stands for: the file itself, or a registry directory's
    ``acceptance/*.yaml`` (a directory without ``acceptance/`` is read as that folder)."""
    if path.is_dir():
        folder = path / ACCEPTANCE_DIR if (path / ACCEPTANCE_DIR).is_dir() else path
        return sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    return [path]


def _entry_problem(root: Path, file: Path) -> Problem | None:
    """A registry entry that leaves its directory (``acceptance/`` a symlink elsewhere, or an
    entry a symlink to any file the user can read) is refused before it is opened: the
    registry may come from someone else, and the file's lines would be checked as a set."""
    if file.parent != root:
        try:
            inside(root, file.parent.name, "(directory)", str(file.parent))
        except ValidationError as exc:
            return exc.problems[0]
    try:
        inside(file.parent, file.name, "(file)", str(file))
    except ValidationError as exc:
        return exc.problems[0]
    return None


def load_sets(paths: Iterable[Path]) -> list[RegisteredSet]:
    """Load and validate every set under ``paths``; raise one error listing every problem."""
    problems: list[Problem] = []
    loaded: list[RegisteredSet] = []
    for path in paths:
        if not path.exists():
            problems.append(Problem(str(path), "(file)", "does not exist"))
            continue
        files = set_files(path)
        if path.is_dir() and not files:
            problems.append(
                Problem(str(path), "(directory)", f"holds no {ACCEPTANCE_DIR}/*.yaml profile sets")
            )
        for file in files:
            refused = _entry_problem(path, file) if path.is_dir() else None
            if refused is not None:
                problems += [] if refused in problems else [refused]  # a folder: once
                continue
            try:
                profile_set = load(AcceptanceProfileSet, file)
            except ValidationError as exc:
                problems += exc.problems
                continue
            if profile_set.name != file.stem:
                log.warning(
                    "%s: name %s differs from the file name; scenarios find the set as %r",
                    file,
                    reprlib.repr(profile_set.name),  # a name may be megabytes long
                    file.stem,
                )
            loaded.append(RegisteredSet(file.stem, file, profile_set))
    if problems:
        raise ValidationError(problems)
    return loaded


class Registry:
    """Profile sets by name. Two sets of one name are refused, not shadowed."""

    def __init__(self, sets: Sequence[RegisteredSet]) -> None:
        problems: list[Problem] = []
        self._sets: dict[str, RegisteredSet] = {}
        for s in sets:
            if s.name in self._sets:
                first = self._sets[s.name].path
                problems.append(Problem(str(s.path), "name", f"set {s.name!r} is also at {first}"))
            else:
                self._sets[s.name] = s
        if problems:
            raise ValidationError(problems)

    @classmethod
    def load(cls, extra: Iterable[Path] = (), shipped: bool = True) -> Registry:
        """The shipped registry (unless ``shipped`` is false) plus the directories in ``extra``."""
        dirs = [shipped_registry()] if shipped else []
        return cls(load_sets([*dirs, *extra]))

    def __iter__(self) -> Iterator[RegisteredSet]:
        return iter(self._sets.values())

    def __len__(self) -> int:
        return len(self._sets)

    def __contains__(self, name: object) -> bool:
        return name in self._sets

    @property
    def names(self) -> list[str]:
        return list(self._sets)

    def get(self, name: str) -> RegisteredSet | None:
        return self._sets.get(name)

    def find(
        self, key: ProfileKey, names: Sequence[str] | None = None
    ) -> list[tuple[str, Profile]]:
        """Every (set name, profile) matching ``key``, in the sets ``names`` (default: all)."""
        chosen = [self._sets[n] for n in names] if names is not None else list(self)
        hits = [(s.name, s.profile_set.find(key)) for s in chosen]
        return [(name, p) for name, p in hits if p is not None]
