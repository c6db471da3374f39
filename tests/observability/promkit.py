"""A real Prometheus on loopback, and the Grafana dashboard's queries as Grafana would send them.

Shared by the observability tier (``tests/observability``: a forced ``speclens serve``) and the peer
tier (``tests/peers/test_dashboard_vllm.py``: a real vLLM), so both evaluate the same panel queries
through the same kind of server:

- ``Prometheus``: the ``prometheus`` binary on a free loopback port, with its own configuration
  (``deploy/prometheus/prometheus.yml`` with the targets and the scrape interval replaced) and its
  own TSDB directory; always stopped (SIGTERM, wait, SIGKILL).
- ``dashboard_queries``: every panel target of ``deploy/grafana/speclens-speculative-decoding.json``;
  ``substitute`` fills in template variables the way Grafana does before it sends a query;
  ``alternatives`` splits a query at its top-level ``or``, so a test can say which side answered.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "speclens-speculative-decoding.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
#: The tests scrape every 2 s: a server busy with load can take a second to answer /metrics.
SCRAPE_INTERVAL_S = 2
#: Grafana's ``$__rate_interval``: max($__interval + scrape interval, 4 x scrape interval); on a
#: short time range ``$__interval`` is under a second, so four scrape intervals.
RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL_S}s"
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
#: Grafana's own variables; every other ``$name`` in a query must be a dashboard variable.
BUILTINS = ("__rate_interval", "__interval", "__range", "__range_s", "__range_ms", "__interval_ms")
#: The panels whose queries have two sides (``A or B``, where the engines name a figure
#: differently), and which side answers on each engine: speclens serve has ATOM's accepted-count
#: counter and its own decode-step counter but no per-request TPOT histogram; vLLM the reverse.
#: Each side answers on one engine only, so each ``or`` is needed.
ANSWERING_SIDE = {
    "speclens": {
        "Realized acceptance length": 0,
        "Accepted drafts per verify step": 0,
        "Tokens per decode step": 0,
        "Time per output token": 1,
    },
    "vllm": {
        "Realized acceptance length": 1,
        "Accepted drafts per verify step": 1,
        "Tokens per decode step": 1,
        "Time per output token": 0,
    },
}
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))|\[\[(\w+)(?::\w+)?\]\]")


@dataclass(frozen=True)
class Query:
    """One panel target: the panel's title, the target's refId, its PromQL and legend."""

    panel: str
    ref: str
    expr: str
    legend: str


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    import json

    return dict(json.loads(path.read_text(encoding="utf-8")))


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every target of every panel (rows' nested panels included), in dashboard order."""
    out: list[Query] = []
    stack = list(dashboard.get("panels", []))
    while stack:
        panel = stack.pop(0)
        stack[:0] = panel.get("panels", [])
        for target in panel.get("targets", []):
            out.append(
                Query(
                    panel["title"], target["refId"], target["expr"], target.get("legendFormat", "")
                )
            )
    return out


def variables_used(expr: str) -> set[str]:
    """The names of the ``$name`` / ``${name}`` / ``[[name]]`` variables in ``expr``."""
    names = {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(expr)}
    return {n for n in names if not n.isdigit()}  # $1 in a label_replace is not a variable


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with its variables replaced as Grafana replaces them; KeyError on one unknown."""

    def one(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name.isdigit():
            return match.group(0)
        if name not in values:
            raise KeyError(f"no value for the variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(one, expr)


def alternatives(expr: str) -> list[str]:
    """``expr`` split at its top-level ``or`` (outside brackets and strings): each operand alone.

    ``or`` binds loosest in PromQL, so ``a / b or c / d`` is ``(a / b) or (c / d)``."""
    parts: list[str] = []
    depth, start, i, quote = 0, 0, 0, ""
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif (
            depth == 0
            and expr.startswith("or", i)
            and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:"))
            and (i + 2 == len(expr) or not (expr[i + 2].isalnum() or expr[i + 2] in "_:"))
        ):
            parts.append(expr[start:i].strip())
            start = i + 2
            i += 1
        i += 1
    parts.append(expr[start:].strip())
    return parts


def scrape_config(targets: list[str], interval_s: int = SCRAPE_INTERVAL_S) -> dict[str, Any]:
    """The deploy configuration, scraping ``targets`` every ``interval_s`` seconds."""
    config = dict(yaml.safe_load(SCRAPE_CONFIG.read_text(encoding="utf-8")))
    config["global"] = {
        **config.get("global", {}),
        "scrape_interval": f"{interval_s}s",
        "evaluation_interval": f"{interval_s}s",
    }
    jobs = config["scrape_configs"]
    assert len(jobs) == 1, "the deploy configuration has one job, the one the tests re-target"
    jobs[0] = {**jobs[0], "static_configs": [{"targets": targets}]}
    return config


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def finite(result: list[dict[str, Any]]) -> list[float]:
    """The finite values of an instant-vector result."""
    values = [float(r["value"][1]) for r in result]
    return [v for v in values if math.isfinite(v)]


class QueryError(RuntimeError):
    """Prometheus refused a query (a syntax error, a bad function call)."""


class Prometheus:
    """``prometheus`` on loopback with ``config``; ``with Prometheus(...) as prom:`` starts it,
    waits until it is ready and stops it (its pid is gone when the block ends)."""

    def __init__(self, binary: str, config: Mapping[str, Any], workdir: Path) -> None:
        self.binary = binary
        self.config = config
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "prometheus.log"
        self.client = httpx.Client(timeout=30.0)  # one kept-alive connection for every query

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(dict(self.config)), encoding="utf-8")
        cmd = [
            self.binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with {self.proc.returncode} while starting:\n"
                    f"{self.log.read_text(errors='replace')[-3000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/-/ready", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready after {STARTUP_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL on timeout. Safe to call twice."""
        self.client.close()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)

    def wait_scraped(self, timeout: float = 30.0) -> None:
        """Until every target has been scraped successfully once."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            up = self.query("up")
            if up and all(float(r["value"][1]) == 1.0 for r in up):
                return
            time.sleep(0.2)
        raise RuntimeError(f"prometheus never scraped its targets: {self.targets()}")

    def targets(self) -> list[dict[str, Any]]:
        body = httpx.get(self.url + "/api/v1/targets", timeout=10.0).json()
        return list(body["data"]["activeTargets"])

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query through ``/api/v1/query``: the result vector (``[]``: no data)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = self.client.get(self.url + "/api/v1/query", params=params).json()
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType')}: {body.get('error')}: {expr}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def label_values(self, definition: str, values: Mapping[str, str]) -> list[str]:
        """A ``label_values(SELECTOR, LABEL)`` variable query, as Grafana's Prometheus data
        source runs it (``/api/v1/label/LABEL/values`` with ``match[]``)."""
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition.strip())
        if m is None:
            raise ValueError(f"not a label_values(SELECTOR, LABEL) query: {definition}")
        selector, label = substitute(m.group(1), values), m.group(2)
        body = httpx.get(
            self.url + f"/api/v1/label/{label}/values",
            params={"match[]": selector},
            timeout=10.0,
        ).json()
        if body.get("status") != "success":
            raise QueryError(f"{body.get('error')}: {definition}")
        return list(body["data"])


def resolve_variables(
    prom: Prometheus, dashboard: Mapping[str, Any], given: Mapping[str, str]
) -> dict[str, str]:
    """Values for every template variable, in dashboard order: ``given`` first; a query variable
    takes the one value its ``label_values`` query returns (its selected "All" would be ``.*``);
    a textbox its default. Raises when a query variable returns nothing."""
    values = dict(given)
    for var in dashboard["templating"]["list"]:
        name = var["name"]
        if name in values:
            continue
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            found = prom.label_values(query, values)
            if len(found) != 1:
                raise AssertionError(f"variable {name}: {query} returned {found}, expected one")
            values[name] = found[0]
        elif var["type"] == "textbox":
            values[name] = str(var["query"])
    return values


@contextlib.contextmanager
def prometheus_scraping(binary: str, targets: list[str], workdir: Path) -> Iterator[Prometheus]:
    """A ready Prometheus that has scraped ``targets`` once."""
    with Prometheus(binary, scrape_config(targets), workdir) as prom:
        prom.wait_scraped()
        yield prom
