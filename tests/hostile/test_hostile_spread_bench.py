"""``speclens bench --expect-acceptance-spread`` under bad input: a spread file that is not a
spread, one at another K than the run's, one whose mean disagrees with the expected AL, or the
flag without the AL it spreads, is refused before any request is sent (exit 2), one line a
problem naming the file and the field."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from serverkit import free_port

GOOD = {"p0": 1.6, "p5": 2.0, "p10": 2.2, "p25": 2.6, "p50": 3.1, "p75": 3.6, "p90": 4.0,
        "p95": 4.3, "p100": 4.9}  # fmt: skip
MEAN = 3.1125  # GOOD's implied mean


class Stub:
    """A server in a thread whose /version says K ``k``; counts every request it gets."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.port = free_port()
        self.requests: list[str] = []
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _any(self, request: web.Request) -> web.Response:
        self.requests.append(request.path)
        return web.Response(status=500, text="boom")

    async def _version(self, request: web.Request) -> web.Response:
        acceptance = {"method": "ngram", "num_speculative_tokens": self.k, "forced": True}
        return web.json_response({"version": "0", "hardware": "cpu", "acceptance": acceptance})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/version", self._version)
        app.router.add_route("*", "/v1/{tail:.*}", self._any)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> Stub:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def stub() -> Iterator[Stub]:
    with Stub(4) as server:
        yield server


def spread_file(tmp_path: Path, text: str | None = None, **changes: Any) -> Path:
    data = {"num_spec_tokens": 4, "quantiles": dict(GOOD), "requests": 200, **changes}
    if text is None:
        quantiles = ", ".join(f"{k}: {v}" for k, v in data.pop("quantiles").items())
        text = "".join(f"{k}: {v}\n" for k, v in data.items()) + f"quantiles: {{{quantiles}}}\n"
    path = tmp_path / "spread.yaml"
    path.write_text(text)
    return path


def refused(run_cli: Any, stub: Stub, *args: str | Path) -> list[str]:
    code, _, stderr = run_cli(
        "bench", "--url", stub.url, "--model", "m", "--num-requests", "3", *args
    )
    assert code == 2, stderr
    assert stub.requests == []  # nothing sent: not even the preflight's request
    lines: list[str] = stderr.strip().splitlines()
    return lines


def expect(path: Path, length: float = MEAN, *more: str) -> list[str | Path]:
    return ["--expect-acceptance-length", str(length), "--expect-acceptance-spread", path, *more]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"quantiles": {**GOOD, "p75": 3.0}},
         "quantiles: fall from p50 3.1 to p75 3: quantiles never decrease"),
        ({"quantiles": {**GOOD, "p100": 5.5}},
         "quantiles: p100 5.5 outside [1, K + 1] = [1, 5]: a request's AL counts the target's "
         "own token and at most K drafts"),
        ({"requests": 12}, "requests: must be at least 20, got 12"),
        ({"quantiles": {k: v for k, v in GOOD.items() if k != "p90"}}, "quantiles: "),
    ],
    ids=["falling", "above-k-plus-1", "too-few-requests", "missing-level"],
)  # fmt: skip
def test_a_file_that_is_not_a_spread_is_refused(
    run_cli: Any, stub: Stub, tmp_path: Path, changes: dict[str, Any], line: str
) -> None:
    path = spread_file(tmp_path, **changes)
    lines = refused(run_cli, stub, *expect(path))
    assert len(lines) == 1 and lines[0].startswith(f"{path}: {line}")


@pytest.mark.timeout(60)
def test_an_unreadable_or_shapeless_file_is_refused(
    run_cli: Any, stub: Stub, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.yaml"
    assert refused(run_cli, stub, *expect(missing)) == [
        f"{missing}: (file): cannot be read: No such file or directory"
    ]
    listed = spread_file(tmp_path, text="- 1\n")
    assert refused(run_cli, stub, *expect(listed)) == [
        f"{listed}: (document): expected a mapping, got list"
    ]


@pytest.mark.timeout(60)
def test_a_spread_at_another_k_than_the_run_is_refused(
    run_cli: Any, stub: Stub, tmp_path: Path
) -> None:
    path = spread_file(tmp_path)
    stated = refused(run_cli, stub, *expect(path, MEAN, "--num-spec-tokens", "3"))
    assert stated == [
        f"{path}: num_spec_tokens: is 4, but --num-spec-tokens says K 3: a spread is refused "
        "at another K, never rescaled"
    ]
    with Stub(3) as served:  # no --num-spec-tokens: the server's /version says K 3
        lines = refused(run_cli, served, *expect(path))
    assert lines == [
        f"{path}: num_spec_tokens: is 4, but the server's /version says K 3: a spread is "
        "refused at another K, never rescaled"
    ]


@pytest.mark.timeout(60)
def test_a_spread_whose_mean_is_not_the_expected_al_is_refused(
    run_cli: Any, stub: Stub, tmp_path: Path
) -> None:
    path = spread_file(tmp_path)
    assert refused(run_cli, stub, *expect(path, 3.5)) == [
        f"{path}: quantiles: imply a mean AL of 3.1125, 0.3875 from --expect-acceptance-length "
        "3.5, beyond the tolerance 0.05"
    ]
    tolerant = spread_file(tmp_path, tolerance=0.2)
    assert refused(run_cli, stub, *expect(tolerant, 3.5))[0].endswith("beyond the tolerance 0.2")


@pytest.mark.timeout(60)
def test_the_flag_needs_the_al_it_spreads(run_cli: Any, stub: Stub, tmp_path: Path) -> None:
    path = spread_file(tmp_path)
    alone = refused(run_cli, stub, "--expect-acceptance-spread", path)
    assert alone == [
        "command line: --expect-acceptance-spread: needs --expect-acceptance-length (the AL "
        "it spreads)"
    ]
    with_profile = refused(run_cli, stub, "--expect-acceptance-spread", path, "--expect-profile")
    assert with_profile == [
        "command line: --expect-acceptance-spread: goes with --expect-acceptance-length; "
        "--expect-profile carries the profile's own spread"
    ]
