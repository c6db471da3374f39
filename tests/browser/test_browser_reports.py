"""report.html in a real browser (Debian's chromium, headless, over the DevTools protocol): every
run, sweep and compare page loads with no console error, no exception and no network request
but the file itself; the numbers in the rendered DOM equal the JSON beside it; the realized AL
is on screen; a failed verification is the first thing on the page; the screenshot is not
blank. The harness itself is checked against a page that does fetch and does log an error."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from cdp import Browser, Loaded
from chromium_env import ensure_chromium
from PIL import Image

from reportkit import ReportDirs, field_mismatches, make_dirs

pytestmark = pytest.mark.integration

#: A screenshot is "not blank" with this many distinct colours and this share of non-white
#: pixels (a rendered run page has thousands of colours and about 17% ink; a blank one has 1).
MIN_COLOURS = 64
MIN_INK = 0.03


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser(ensure_chromium())
    yield b
    b.close()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReportDirs]:
    yield make_dirs(tmp_path_factory.mktemp("browser-reports"))


PAGES = {
    "run": ("run_ok", "summary.json"),
    "failed run": ("run_fail", "summary.json"),
    "sweep": ("sweep", "sweep.json"),
    "compare": ("compare", "compare.json"),
}


def ink(png: bytes) -> tuple[int, float]:
    """(distinct colours, share of pixels that are not near-white) of a screenshot."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 24) or []
    white = sum(n for n, c in colours if min(c) >= 250)
    return len(colours), 1 - white / (image.width * image.height)


def check_clean(loaded: Loaded) -> None:
    assert loaded.console_errors == []
    assert loaded.exceptions == []
    assert loaded.requests == [loaded.url]
    colours, share = ink(loaded.screenshot)
    assert colours > MIN_COLOURS and share > MIN_INK, (colours, share)


@pytest.mark.parametrize("name", list(PAGES))
def test_every_report_loads_clean_and_its_dom_equals_the_json(
    name: str, dirs: ReportDirs, browser: Browser
) -> None:
    attr, source = PAGES[name]
    directory: Path = getattr(dirs, attr)
    loaded = browser.load(directory / "report.html")
    check_clean(loaded)
    data = orjson.loads((directory / source).read_bytes())
    assert len(loaded.fields) > 10
    assert field_mismatches([(p, t) for p, t, _ in loaded.fields], data) == []
    visible = {p for p, _, shown in loaded.fields if shown}
    al = {
        "summary.json": "figures.acceptance.token_weighted_al",
        "sweep.json": "stats[0].figures.realized_al.mean",
        "compare.json": "pairs[0].deltas.matched_concurrency[0].ratio",
    }[source]
    assert al in visible, f"{al} is not on screen"


def test_a_failed_verification_is_the_first_thing_on_the_page(
    dirs: ReportDirs, browser: Browser
) -> None:
    banner = browser.load(dirs.run_fail / "report.html").first_banner
    assert banner is not None and "fail" in banner["cls"].split()
    assert banner["text"].startswith("verification FAIL")
    assert banner["top"] < 150  # right under the title, above the fold


def test_the_harness_sees_a_fetch_a_console_error_and_a_blank_page(
    tmp_path: Path, browser: Browser
) -> None:
    """The checks above are only as good as what the harness reports: a page that logs an
    error, throws, and fetches an image must show all three; a blank page must read blank."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><script>console.error("boom"); null.x;</script>'
        '<img src="http://127.0.0.1:9/x.png"></body></html>'
    )
    loaded = browser.load(bad)
    assert any("boom" in e for e in loaded.console_errors)
    assert loaded.exceptions
    assert "http://127.0.0.1:9/x.png" in loaded.requests
    blank = tmp_path / "blank.html"
    blank.write_text("<html><body></body></html>")
    colours, share = ink(browser.load(blank).screenshot)
    assert colours <= MIN_COLOURS and share <= MIN_INK
