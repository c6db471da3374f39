"""A validator for Grafana dashboard JSON at the schema version it declares (no network).

It checks what Grafana's dashboard kind (``kinds/dashboard/dashboard_kind.cue``, the schema of
dashboards at ``schemaVersion`` 36 to 39) requires of a dashboard, its panels, targets and
template variables, plus what Grafana assumes without the schema saying it (unique panel ids and
refIds, panels that fit the 24-column grid without overlapping, queries that name only variables
the dashboard defines). ``validate`` returns one ``<path>: <what is wrong>`` line per problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promkit import BUILTINS, variables_used

#: Schema versions this validator knows: 36 made every datasource reference an object
#: ``{type, uid}``; 39 is the version Grafana 10.3 and 10.4 write.
KNOWN_VERSIONS = range(36, 40)
VARIABLE_TYPES = {
    "query",
    "adhoc",
    "constant",
    "datasource",
    "interval",
    "textbox",
    "custom",
    "system",
}
#: Panels of Grafana's core plugins at these versions (React; the Angular ones are migrated away).
PANEL_TYPES = {
    "timeseries", "stat", "gauge", "bargauge", "barchart", "table", "text", "heatmap", "histogram",
    "piechart", "state-timeline", "status-history", "logs", "news", "dashlist", "row",
}  # fmt: skip
ANGULAR = {"graph", "singlestat", "table-old", "grafana-piechart-panel"}
GRID_COLUMNS = 24


def _is_uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _datasource(path: str, ref: Any, errors: list[str]) -> None:
    if not isinstance(ref, Mapping):
        errors.append(f"{path}: a datasource reference is an object {{type, uid}} since version 36")
        return
    for key in ("type", "uid"):
        if key in ref and not isinstance(ref[key], str):
            errors.append(f"{path}.{key}: expected a string")


def _grid(path: str, grid: Any, errors: list[str]) -> tuple[int, int, int, int] | None:
    if not isinstance(grid, Mapping):
        errors.append(f"{path}: missing (an object with h, w, x, y)")
        return None
    for key in ("h", "w", "x", "y"):
        if not _is_uint(grid.get(key)):
            errors.append(f"{path}.{key}: expected an unsigned integer, got {grid.get(key)!r}")
            return None
    h, w, x, y = (int(grid[k]) for k in ("h", "w", "x", "y"))
    if h <= 0:
        errors.append(f"{path}.h: {h} is not > 0")
    if not 1 <= w <= GRID_COLUMNS:
        errors.append(f"{path}.w: {w} is not in 1..{GRID_COLUMNS}")
    if x >= GRID_COLUMNS:
        errors.append(f"{path}.x: {x} is not < {GRID_COLUMNS}")
    if x + w > GRID_COLUMNS:
        errors.append(f"{path}: x + w = {x + w} runs past the {GRID_COLUMNS}-column grid")
    return h, w, x, y


def _panel(path: str, panel: Any, variables: set[str], errors: list[str]) -> None:
    if not isinstance(panel, Mapping):
        errors.append(f"{path}: expected an object")
        return
    kind = panel.get("type")
    if not isinstance(kind, str) or not kind:
        errors.append(f"{path}.type: missing (a non-empty plugin id)")
    elif kind in ANGULAR:
        errors.append(f"{path}.type: {kind!r} is an Angular panel, migrated away at this version")
    elif kind not in PANEL_TYPES:
        errors.append(f"{path}.type: {kind!r} is not a core panel type ({sorted(PANEL_TYPES)})")
    if not isinstance(panel.get("title"), str) or not panel["title"].strip():
        errors.append(f"{path}.title: missing")
    if "datasource" in panel:
        _datasource(f"{path}.datasource", panel["datasource"], errors)
    if kind == "row":
        if not isinstance(panel.get("panels"), list):
            errors.append(f"{path}.panels: a row needs its (possibly empty) panels list")
        return
    field_config = panel.get("fieldConfig")
    if not isinstance(field_config, Mapping):
        errors.append(f"{path}.fieldConfig: missing (an object with defaults and overrides)")
    else:
        if not isinstance(field_config.get("defaults"), Mapping):
            errors.append(f"{path}.fieldConfig.defaults: missing (an object)")
        overrides = field_config.get("overrides")
        if not isinstance(overrides, list):
            errors.append(f"{path}.fieldConfig.overrides: missing (a list)")
        else:
            for i, override in enumerate(overrides):
                if not isinstance(override.get("matcher"), Mapping) or not isinstance(
                    override.get("properties"), list
                ):
                    errors.append(
                        f"{path}.fieldConfig.overrides[{i}]: needs a matcher and properties"
                    )
    if not isinstance(panel.get("options"), Mapping):
        errors.append(f"{path}.options: missing (an object)")
    if not isinstance(panel.get("transformations"), list):
        errors.append(f"{path}.transformations: missing (a list, empty for none)")
    targets = panel.get("targets")
    if not isinstance(targets, list) or not targets:
        errors.append(f"{path}.targets: a data panel needs at least one target")
        return
    refs: set[str] = set()
    for i, target in enumerate(targets):
        where = f"{path}.targets[{i}]"
        ref = target.get("refId")
        if not isinstance(ref, str) or not ref:
            errors.append(f"{where}.refId: missing")
        elif ref in refs:
            errors.append(f"{where}.refId: {ref!r} is used twice in this panel")
        else:
            refs.add(ref)
        if "datasource" in target:
            _datasource(f"{where}.datasource", target["datasource"], errors)
        expr = target.get("expr")
        if not isinstance(expr, str) or not expr.strip():
            errors.append(f"{where}.expr: missing (a PromQL query)")
            continue
        if expr.count("(") != expr.count(")"):
            errors.append(f"{where}.expr: unbalanced parentheses")
        unknown = variables_used(expr) - variables - set(BUILTINS)
        if unknown:
            errors.append(f"{where}.expr: names undefined variables {sorted(unknown)}")


def _variable(path: str, var: Any, errors: list[str]) -> None:
    if not isinstance(var, Mapping):
        errors.append(f"{path}: expected an object")
        return
    if not isinstance(var.get("name"), str) or not var["name"].isidentifier():
        errors.append(f"{path}.name: missing or not a variable name: {var.get('name')!r}")
    if var.get("type") not in VARIABLE_TYPES:
        errors.append(f"{path}.type: {var.get('type')!r} is not one of {sorted(VARIABLE_TYPES)}")
    if var.get("hide", 0) not in (0, 1, 2):
        errors.append(f"{path}.hide: {var.get('hide')!r} is not 0, 1 or 2")
    if var.get("type") == "query":
        _datasource(f"{path}.datasource", var.get("datasource"), errors)
        query = var.get("query")
        text = query.get("query") if isinstance(query, Mapping) else query
        if not isinstance(text, str) or not text.strip():
            errors.append(f"{path}.query: a query variable needs its query")
        if var.get("refresh") not in (1, 2):
            errors.append(
                f"{path}.refresh: {var.get('refresh')!r} is not 1 (on load) or 2 (on time range change)"
            )
    if var.get("type") == "datasource" and not isinstance(var.get("query"), str):
        errors.append(f"{path}.query: a datasource variable names the plugin id, e.g. 'prometheus'")


def validate(dashboard: Any) -> list[str]:
    """Every problem found, ``<path>: <what is wrong>``; empty for a valid dashboard."""
    errors: list[str] = []
    if not isinstance(dashboard, Mapping):
        return ["dashboard: expected a JSON object"]
    version = dashboard.get("schemaVersion")
    if not _is_uint(version):
        errors.append("schemaVersion: missing (an unsigned integer)")
    elif version not in KNOWN_VERSIONS:
        errors.append(
            f"schemaVersion: {version} is not a version this validator knows "
            f"({KNOWN_VERSIONS.start}..{KNOWN_VERSIONS.stop - 1})"
        )
    for key in ("title", "uid"):
        if not isinstance(dashboard.get(key), str) or not dashboard[key]:
            errors.append(f"{key}: missing (a non-empty string)")
    uid = dashboard.get("uid")
    if isinstance(uid, str) and len(uid) > 40:
        errors.append(f"uid: {len(uid)} characters, at most 40")
    if dashboard.get("graphTooltip", 0) not in (0, 1, 2):
        errors.append(f"graphTooltip: {dashboard.get('graphTooltip')!r} is not 0, 1 or 2")
    if not isinstance(dashboard.get("editable", True), bool):
        errors.append("editable: expected true or false")
    if dashboard.get("style", "dark") not in ("dark", "light"):
        errors.append(f"style: {dashboard.get('style')!r} is not 'dark' or 'light'")
    refresh = dashboard.get("refresh", False)
    if refresh is not False and not isinstance(refresh, str):
        errors.append(f"refresh: {refresh!r} is not an interval string or false")
    month = dashboard.get("fiscalYearStartMonth", 0)
    if not _is_uint(month) or month >= 12:
        errors.append(f"fiscalYearStartMonth: {month!r} is not in 0..11")
    time_range = dashboard.get("time")
    if not isinstance(time_range, Mapping) or not all(
        isinstance(time_range.get(k), str) for k in ("from", "to")
    ):
        errors.append("time: expected {from, to} strings")
    tags = dashboard.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        errors.append("tags: expected a list of strings")
    for i, annotation in enumerate((dashboard.get("annotations") or {}).get("list", [])):
        for key in ("name", "iconColor"):
            if not isinstance(annotation.get(key), str):
                errors.append(f"annotations.list[{i}].{key}: missing")
        _datasource(f"annotations.list[{i}].datasource", annotation.get("datasource"), errors)

    templating = dashboard.get("templating")
    variables: set[str] = set()
    if not isinstance(templating, Mapping) or not isinstance(templating.get("list"), list):
        errors.append("templating.list: missing (a list of variables)")
    else:
        for i, var in enumerate(templating["list"]):
            _variable(f"templating.list[{i}]", var, errors)
            if isinstance(var, Mapping) and isinstance(var.get("name"), str):
                if var["name"] in variables:
                    errors.append(f"templating.list[{i}].name: {var['name']!r} is defined twice")
                variables.add(var["name"])

    panels = dashboard.get("panels")
    if not isinstance(panels, list) or not panels:
        errors.append("panels: missing (a non-empty list)")
        return errors
    ids: dict[int, str] = {}
    cells: dict[tuple[int, int], str] = {}
    flat = [(f"panels[{i}]", p) for i, p in enumerate(panels)]
    for i, panel in enumerate(panels):
        if isinstance(panel, Mapping) and panel.get("type") == "row":
            flat += [(f"panels[{i}].panels[{j}]", p) for j, p in enumerate(panel.get("panels", []))]
    for path, panel in flat:
        _panel(path, panel, variables, errors)
        if not isinstance(panel, Mapping):
            continue
        pid = panel.get("id")
        if not _is_uint(pid):
            errors.append(f"{path}.id: missing (an unsigned integer)")
        elif pid in ids:
            errors.append(f"{path}.id: {pid} is also the id of {ids[pid]}")
        else:
            ids[pid] = path
        grid = _grid(f"{path}.gridPos", panel.get("gridPos"), errors)
        if grid is None:
            continue
        h, w, x, y = grid
        for row in range(y, y + h):
            for col in range(x, min(x + w, GRID_COLUMNS)):
                other = cells.setdefault((row, col), path)
                if other != path:
                    errors.append(f"{path}.gridPos: overlaps {other}")
                    break
            else:
                continue
            break
    return errors
