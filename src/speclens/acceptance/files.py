"""Reading acceptance documents from YAML into validated models, with every problem located.

A YAML syntax error, a duplicate key, a non-mapping document and every schema problem all come
out as one ``ValidationError`` whose lines read ``<file>: <path.to.field>: <what is wrong>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from speclens.acceptance.errors import Problem, ValidationError

M = TypeVar("M", bound=BaseModel)


def format_loc(loc: tuple[str | int, ...], prefix: str = "") -> str:
    """``('profiles', 2, 'per_position_rates')`` -> ``profiles[2].per_position_rates``."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # '<<: *anchor' merges; the mapping's own keys may override merged ones
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str | int | float | bool):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def parse_yaml(text: str, file: str) -> Any:
    """Parse YAML safely; a syntax error or duplicate key becomes a ``ValidationError``."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise ValidationError([Problem(file, where, f"invalid YAML: {exc.problem}")]) from None
    except yaml.YAMLError as exc:
        raise ValidationError([Problem(file, "(document)", f"invalid YAML: {exc}")]) from None


def read_yaml(path: Path | str) -> Any:
    """Read and parse a YAML file; an unreadable file is a ``ValidationError`` too."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError([Problem(str(path), "(file)", f"cannot be read: {exc}")]) from None
    return parse_yaml(text, str(path))


def validate(model: type[M], data: Any, file: str = "", prefix: str = "") -> M:
    """Validate ``data`` as ``model``; every problem is raised at once, located under ``prefix``."""
    if not isinstance(data, dict):
        where = prefix or "(document)"
        kind = "nothing" if data is None else type(data).__name__
        raise ValidationError([Problem(file, where, f"expected a mapping, got {kind}")])
    try:
        return model.model_validate(data)
    except PydanticValidationError as exc:
        problems = [
            Problem(file, format_loc(e["loc"], prefix) or "(document)", e["msg"])
            for e in exc.errors()
        ]
        raise ValidationError(problems) from None


def load(model: type[M], path: Path | str, key: str | None = None) -> M:
    """Read a YAML file and validate it (or its top-level ``key``) as ``model``."""
    data = read_yaml(path)
    if key is None:
        return validate(model, data, str(path))
    if not isinstance(data, dict):
        raise ValidationError([Problem(str(path), "(document)", "expected a mapping")])
    if key not in data:
        raise ValidationError([Problem(str(path), key, "is required")])
    return validate(model, data[key], str(path), prefix=key)
