"""The dashboard and the scrape configuration, checked without a running server.

``deploy/grafana/speclens-speculative-decoding.json`` must be valid for the Grafana schema version
it declares (``grafana_schema.validate``), carry the panels and template variables the dashboard
promises, and name only variables it defines; ``deploy/prometheus/prometheus.yml`` must pass
``promtool check config`` and scrape ``speclens serve`` where it listens by default. The validator
and promtool are each shown refusing a broken input, so a pass means something.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from grafana_schema import validate
from promkit import (
    BUILTINS,
    SCRAPE_CONFIG,
    alternatives,
    dashboard_queries,
    load_dashboard,
    scrape_config,
    substitute,
    variables_used,
)

from speclens.cli import app

#: The panels the dashboard promises, by title.
PANELS = {
    "Realized acceptance length",
    "Draft acceptance rate",
    "Acceptance by draft position",
    "Accepted drafts per verify step",
    "Tokens per decode step",
    "Output tokens/s",
    "Time to first token",
    "Time per output token",
}


def test_the_dashboard_is_valid_for_the_schema_version_it_declares() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] == 39
    assert validate(dashboard) == []


def test_the_dashboard_has_its_panels_and_variables() -> None:
    dashboard = load_dashboard()
    assert {p["title"] for p in dashboard["panels"]} == PANELS
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("model_name", "engine"):
        var = variables[name]
        assert var["type"] == "query"
        assert var["query"]["query"].startswith("label_values(")
        assert var["query"]["query"].endswith(f", {name})")
    assert variables["forced_al"]["type"] == "textbox"
    # Every panel reads the data source variable, and every query filters on both labels.
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    for query in dashboard_queries(dashboard):
        if query.expr.endswith("or vector($forced_al)"):  # the target: speclens's own gauge
            assert {"model_name", "forced_al"} <= variables_used(query.expr), query
            continue
        assert {"model_name", "engine"} <= variables_used(query.expr), query


def _break(path: list[Any], value: Any) -> Any:
    def apply(dashboard: dict[str, Any]) -> None:
        node: Any = dashboard
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return apply


BROKEN = {
    "unknown schema version": (_break(["schemaVersion"], 27), "schemaVersion: 27 is not a version"),
    "duplicate panel id": (_break(["panels", 1, "id"], 1), "panels[1].id: 1 is also the id of panels[0]"),
    "panel wider than the grid": (_break(["panels", 0, "gridPos", "w"], 25), "panels[0].gridPos.w: 25 is not in 1..24"),
    "panels overlapping": (_break(["panels", 1, "gridPos", "x"], 6), "panels[1].gridPos: overlaps panels[0]"),
    "panel without type": (_break(["panels", 2, "type"], KeyError), "panels[2].type: missing"),
    "Angular panel": (_break(["panels", 2, "type"], "graph"), "'graph' is an Angular panel"),
    "panel without title": (_break(["panels", 3, "title"], ""), "panels[3].title: missing"),
    "panel without targets": (_break(["panels", 4, "targets"], []), "panels[4].targets: a data panel needs"),
    "panel without fieldConfig": (_break(["panels", 5, "fieldConfig"], KeyError), "panels[5].fieldConfig: missing"),
    "panel without transformations": (_break(["panels", 5, "transformations"], KeyError), "panels[5].transformations: missing"),
    "duplicate refId": (_break(["panels", 6, "targets", 1, "refId"], "A"), "panels[6].targets[1].refId: 'A' is used twice"),
    "empty query": (_break(["panels", 6, "targets", 0, "expr"], " "), "panels[6].targets[0].expr: missing"),
    "undefined variable": (
        _break(["panels", 5, "targets", 0, "expr"], 'sum(rate(vllm:generation_tokens_total{model_name=~"$model"}[$__rate_interval]))'),
        "panels[5].targets[0].expr: names undefined variables ['model']",
    ),
    "string datasource": (_break(["panels", 0, "datasource"], "Prometheus"), "panels[0].datasource: a datasource reference is an object"),
    "no templating list": (_break(["templating"], {}), "templating.list: missing"),
    "variable of no known type": (_break(["templating", "list", 1, "type"], "dropdown"), "templating.list[1].type: 'dropdown' is not one of"),
    "query variable without query": (_break(["templating", "list", 2, "query"], {"query": ""}), "templating.list[2].query: a query variable needs"),
    "bad cursor sync": (_break(["graphTooltip"], 3), "graphTooltip: 3 is not 0, 1 or 2"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_the_validator_refuses_a_broken_dashboard(case: str) -> None:
    breaker, expected = BROKEN[case]
    dashboard = copy.deepcopy(load_dashboard())
    breaker(dashboard)
    errors = validate(dashboard)
    assert any(expected in e for e in errors), errors


def test_every_query_names_only_defined_variables_and_builtins() -> None:
    dashboard = load_dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]} | set(BUILTINS)
    values = {name: "x" for name in defined}
    for query in dashboard_queries(dashboard):
        assert variables_used(query.expr) <= defined, query
        assert "$" not in substitute(query.expr, values), query


def test_alternatives_split_only_at_the_top_level_or() -> None:
    assert alternatives("a or b") == ["a", "b"]
    assert alternatives("x / y or (z or vector(0)) / w") == ["x / y", "(z or vector(0)) / w"]
    # "or" inside a name, a string, a function or brackets is not the operator.
    expr = 'sum(rate(vllm:or_total{x="a or b"}[1m])) / vector(0) or orbit'
    assert alternatives(expr) == ['sum(rate(vllm:or_total{x="a or b"}[1m])) / vector(0)', "orbit"]
    assert alternatives("histogram_quantile(0.5, x)") == ["histogram_quantile(0.5, x)"]


def _promtool(promtool: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )


def test_the_deploy_scrape_config_passes_promtool(prometheus_bin: tuple[str, str]) -> None:
    done = _promtool(prometheus_bin[1], SCRAPE_CONFIG)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_refuses_a_broken_scrape_config(
    prometheus_bin: tuple[str, str], tmp_path: Path
) -> None:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text(encoding="utf-8"))
    config["global"]["scrape_interval"] = "5"  # no unit
    broken = tmp_path / "prometheus.yml"
    broken.write_text(yaml.safe_dump(config), encoding="utf-8")
    done = _promtool(prometheus_bin[1], broken)
    assert done.returncode != 0
    assert "scrape_interval" in done.stdout + done.stderr or "duration" in done.stdout + done.stderr


def test_the_tier_s_own_scrape_config_passes_promtool(
    prometheus_bin: tuple[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(["127.0.0.1:18000"])), encoding="utf-8")
    done = _promtool(prometheus_bin[1], config)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_deploy_scrape_config_targets_speclens_serve_s_default_port() -> None:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text(encoding="utf-8"))
    (job,) = config["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (static,) = job["static_configs"]
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    (port,) = [p.default for p in serve.params if p.name == "port"]
    assert static["targets"] == [f"127.0.0.1:{port}"]
