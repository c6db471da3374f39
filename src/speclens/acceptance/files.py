"""Reading acceptance documents from YAML into validated models, with every problem located.

A YAML syntax error, a duplicate key, a non-mapping document and every schema problem all come
out as one ``ValidationError`` whose lines read ``<file>: <path.to.field>: <what is wrong>``.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import yaml
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from speclens.acceptance.errors import UNRECOGNIZED_KEY, Problem, ValidationError


class Validated(Protocol):
    """What ``validate`` reads: a pydantic model, or a type that validates as one does
    (``speclens.cost.StepCost``)."""

    @classmethod
    def model_validate(cls, obj: Any) -> Self: ...


M = TypeVar("M", bound=Validated)


def format_loc(loc: tuple[str | int, ...], prefix: str = "") -> str:
    """``('profiles', 2, 'per_position_rates')`` -> ``profiles[2].per_position_rates``."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


#: Largest YAML file read, in bytes, checked before reading. Shipped profile sets are under
#: 10 KiB; 4 MiB is room for thousands of profiles (the node limit below binds first).
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Deepest nesting of lists and mappings (aliases counted as expanded). Acceptance documents
#: nest about 5 deep; the composer, the constructor and pydantic all recurse per level.
MAX_DEPTH = 64
#: Most nodes in a document with every alias expanded. Validation and error reporting walk the
#: expanded tree, so this (not the file size) bounds their time against an alias bomb.
MAX_NODES = 100_000
#: Most characters of scalar text with every alias expanded: aliases may not make a document
#: larger than a file could be written out in full. Bounds every message that quotes values.
MAX_EXPANDED_CHARS = MAX_FILE_BYTES
#: Longest integer literal. At 1,000 characters a value prints in decimal within Python's
#: 4,300-digit limit whatever its base (0x, 0o, 0b), and a YAML 1.1 sexagesimal integer
#: (1:30:00, converted in quadratic time) stays cheap.
MAX_INT_CHARS = 1000

_BASE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_BASE_LOADER):  # type: ignore[valid-type,misc]
    """Safe loader (libyaml's when available) that refuses a key repeated within one mapping
    and reports a value Python cannot convert (a date past month end) at its line."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ValueError as exc:  # yaml.YAMLError is not a ValueError
            raise yaml.constructor.ConstructorError(
                None, None, _one_line(str(exc)), node.start_mark
            ) from None


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters: a message may quote the input."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class KeyedDict(dict[Any, Any]):
    """A mapping read from YAML that remembers where each of its keys stands and how it was
    spelt, so that a message can locate a key without quoting it (a file that is not ours,
    /etc/shadow say, reads as a mapping whose keys are its lines)."""

    __slots__ = ("key_marks",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_marks: dict[Any, KeyMark] = {}


@dataclass(frozen=True)
class KeyMark:
    """Where a key stands (1-based) and its text as written (``01`` and ``+1`` both read as 1)."""

    line: int
    column: int
    text: str | None

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}"


def key_mark(mapping: object, key: object) -> KeyMark | None:
    """Where ``key`` stands in ``mapping``, when the mapping was read from YAML."""
    if not isinstance(mapping, KeyedDict):
        return None
    try:
        return mapping.key_marks.get(key)
    except TypeError:  # an unhashable key
        return None


def _mark_of(node: yaml.Node) -> KeyMark:
    mark = node.start_mark
    text = node.value if isinstance(node, yaml.ScalarNode) else None
    return KeyMark(mark.line + 1, mark.column + 1, text)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[object, KeyMark] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # '<<: *anchor' merges; the mapping's own keys may override merged ones
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str | int | float | bool):
            if key in seen:  # the key is not quoted: the line may not be ours to print
                raise yaml.constructor.ConstructorError(
                    None, None, f"repeats the key at {seen[key]}", key_node.start_mark
                )
            seen[key] = _mark_of(key_node)
    data = KeyedDict(loader.construct_mapping(node, deep=deep))
    for key_node, _ in node.value:  # merged keys too, now flattened in; the last one wins
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str | int | float | bool):
            data.key_marks[key] = _mark_of(key_node)
    return data


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode) -> Any:
    if len(node.value) > MAX_INT_CHARS:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"integer of {len(node.value)} characters, over the limit of {MAX_INT_CHARS}",
            node.start_mark,
        )
    return loader.construct_yaml_int(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
for _dumper in {yaml.SafeDumper, getattr(yaml, "CSafeDumper", yaml.SafeDumper)}:
    _dumper.add_representer(KeyedDict, yaml.representer.SafeRepresenter.represent_dict)


@dataclass
class _Open:
    """A list or mapping being parsed: its anchor, the running totals at its start, and how
    many levels of collections it holds so far."""

    anchor: str | None
    nodes: int
    chars: int
    height: int = 0


def _check_size(text: str, file: str) -> None:
    """Refuse a document nested deeper than ``MAX_DEPTH``, or over ``MAX_NODES`` nodes or
    ``MAX_EXPANDED_CHARS`` characters of scalars once its aliases are expanded, or holding an
    alias inside its own anchor (a cycle). Reads the parser's events (the parser is iterative,
    the composer recursive), so the check is linear in the text and stops at the first excess."""
    nodes = chars = 0  # so far, an alias counted as the whole node it stands for
    anchors: dict[str, tuple[int, int, int]] = {}  # anchor -> (nodes, chars, height), expanded
    stack: list[_Open] = []

    def refuse(event: yaml.Event, message: str) -> None:
        mark = event.start_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise ValidationError([Problem(file, where, message)])

    for event in yaml.parse(text, Loader=_BASE_LOADER):
        height = 0  # of the node this event completes
        if isinstance(event, yaml.CollectionStartEvent):
            stack.append(_Open(event.anchor, nodes, chars))
            nodes += 1
            if len(stack) > MAX_DEPTH:
                refuse(event, f"nested deeper than {MAX_DEPTH} levels")
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            done = stack.pop()
            height = done.height
            if done.anchor is not None:
                anchors[done.anchor] = (nodes - done.nodes, chars - done.chars, height)
        elif isinstance(event, yaml.ScalarEvent):
            nodes += 1
            chars += len(event.value)
            if event.anchor is not None:
                anchors[event.anchor] = (1, len(event.value), 0)
        elif isinstance(event, yaml.AliasEvent):
            name = event.anchor or ""
            if any(o.anchor == name for o in stack):
                refuse(event, f"alias *{name} lies inside its own anchor (a cycle)")
            more_nodes, more_chars, height = anchors.get(name, (1, 0, 0))  # undefined: composer
            nodes, chars = nodes + more_nodes, chars + more_chars
            if len(stack) + height > MAX_DEPTH:
                refuse(event, f"alias *{name} nests deeper than {MAX_DEPTH} levels")
        else:
            continue
        if stack:
            stack[-1].height = max(stack[-1].height, height + 1)
        if nodes > MAX_NODES:
            refuse(event, f"has over {MAX_NODES:,} nodes with its aliases expanded")
        if chars > MAX_EXPANDED_CHARS:
            limit = MAX_EXPANDED_CHARS // 2**20
            refuse(event, f"has over {limit} MiB of text with its aliases expanded")


#: A quoted fragment of the input in a parser message (a tag, an anchor, a token). Up to 4
#: characters stay ('\\t', ':'): they name a character, not a line of the file.
_QUOTED = re.compile(r"'[^']{5,}'|\"[^\"]{5,}\"")


def _problem_text(exc: yaml.MarkedYAMLError) -> str:
    """The parser's problem without what it quotes from the input: the line and column say
    where, and the input may be a file that is not ours to print."""
    text = _one_line(str(exc.problem or exc.context or "cannot be parsed"))
    return _QUOTED.sub("(not shown)", text)


def parse_yaml(text: str, file: str) -> Any:
    """Parse YAML safely; a syntax error, a duplicate key or a document over the size limits
    becomes a ``ValidationError`` located by line and column, quoting none of the input."""
    try:
        _check_size(text, file)
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise ValidationError(
            [Problem(file, where, f"invalid YAML: {_problem_text(exc)}")]
        ) from None
    except (yaml.YAMLError, UnicodeEncodeError) as exc:  # libyaml encodes text: lone surrogates
        message = f"invalid YAML: {_QUOTED.sub('(not shown)', _one_line(str(exc)))}"
        raise ValidationError([Problem(file, "(document)", message)]) from None


def _read_text(path: Path) -> str:
    """The file's text; refuses anything but a regular file of at most ``MAX_FILE_BYTES``.
    Opened non-blocking and checked with fstat, so a FIFO is refused, never waited on."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotReadable(f"is not a regular file ({_kind(info.st_mode)})")
        data = fh.read(MAX_FILE_BYTES + 1) if info.st_size <= MAX_FILE_BYTES else b""
    size = max(info.st_size, len(data))
    if size > MAX_FILE_BYTES:
        limit = MAX_FILE_BYTES // 2**20
        raise _NotReadable(f"is {size:,} bytes, over the {limit} MiB limit for a YAML file")
    return data.decode("utf-8")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a device or socket"


class _NotReadable(Exception):
    """A file refused before parsing; the message completes ``<file>: (file): ...``."""


def read_yaml(path: Path | str) -> Any:
    """Read and parse a YAML file; an unreadable, special or oversize file is a
    ``ValidationError`` too."""
    return parse_yaml(read_checked_text(path), str(path))


def read_checked_text(path: Path | str) -> str:
    """A file's text, read as ``read_yaml`` reads it (a regular UTF-8 file of at most
    ``MAX_FILE_BYTES``); anything else is a ``ValidationError``."""
    path = Path(path)
    try:
        text = _read_text(path)
    except _NotReadable as exc:
        raise ValidationError([Problem(str(path), "(file)", str(exc))]) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValidationError([Problem(str(path), "(file)", f"cannot be read: {reason}")]) from None
    except UnicodeDecodeError as exc:
        message = f"cannot be read: not UTF-8 (byte {exc.start})"
        raise ValidationError([Problem(str(path), "(file)", message)]) from None
    return text


def validate(model: type[M], data: Any, file: str = "", prefix: str = "") -> M:
    """Validate ``data`` as ``model``; every problem is raised at once, located under ``prefix``."""
    if not isinstance(data, dict):
        where = prefix or "(document)"
        kind = "nothing" if data is None else type(data).__name__
        raise ValidationError([Problem(file, where, f"expected a mapping, got {kind}")])
    try:
        return model.model_validate(data)
    except PydanticValidationError as exc:
        root = _model_in(model)
        raise ValidationError([_problem(file, e, data, prefix, root)
                               for e in exc.errors()]) from None  # fmt: skip


def _problem(
    file: str, error: Any, data: Any, prefix: str, model: type[BaseModel] | None = None
) -> Problem:
    """One pydantic error as a located problem; an unrecognized key is named by its line and
    column, never by its text (which may be a line of a file that is not ours), with the valid
    key nearest to it where one is near (a typo: ``comand`` for ``command``)."""
    loc, message = tuple(error["loc"]), str(error["msg"])
    if error["type"] == "extra_forbidden":
        message = UNRECOGNIZED_KEY
    if not loc or not message.startswith(UNRECOGNIZED_KEY):
        return Problem(file, format_loc(loc, prefix) or "(document)", message)
    parent = _walk(data, loc[:-1])
    mark = key_mark(parent, loc[-1])
    if mark is not None:
        where = f"the key at {mark}"
    elif isinstance(parent, dict) and loc[-1] in parent:
        where = f"key {list(parent).index(loc[-1]) + 1} of {len(parent)}"
    else:
        where = "a key"
    hint = _nearest(model, loc) if model is not None else None
    text = f"{where} {message}" + (f"; did you mean {hint!r}?" if hint else "")
    return Problem(file, format_loc(loc[:-1], prefix) or "(document)", text)


def _nearest(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The field of the model at ``loc``'s parent nearest the unknown key ``loc[-1]`` (difflib's
    ratio 0.75 or more), or None."""
    fields = _fields_at(model, loc[:-1])
    key = loc[-1]
    if not fields or not isinstance(key, str):
        return None
    found = difflib.get_close_matches(key, fields, n=1, cutoff=0.75)
    return found[0] if found else None


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The field names of the model nested at ``loc`` (through lists, mappings and optional
    fields), or None where the path leaves the models."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list: the same model
        target = _model_in(current)
        if target is None or part not in target.model_fields:
            return None
        current = target.model_fields[part].annotation
    target = _model_in(current)
    return list(target.model_fields) if target is not None else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: itself, or inside list[...], X | None, Annotated[...]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _walk(data: Any, loc: tuple[Any, ...]) -> Any:
    """The value at ``loc`` inside ``data``, or None when the path does not lead anywhere."""
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def inside(folder: Path, name: Path | str, what: str, file: str) -> Path:
    """``folder / name``, refused unless it stays inside ``folder`` once symlinks and ``..``
    are resolved: a path that leaves its folder can point at any file the user can read."""
    folder_real = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(folder / name))
    if target == folder_real or folder_real not in target.parents:
        raise ValidationError(
            [
                Problem(
                    file,
                    what,
                    f"leaves its folder {folder} (through an absolute path, '..' or a symlink): "
                    "expected a path inside that folder",
                )
            ]
        )
    return target


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
