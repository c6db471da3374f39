"""A small Chrome DevTools Protocol client: headless chromium driven over ``--remote-debugging-pipe``.

The pipe (the browser reads commands on fd 3 and writes replies and events on fd 4, each message
JSON ended by a NUL byte) needs no port, no websocket library and no browser download. One
``Browser`` per test module; ``load`` opens a page in a fresh tab and returns what a test checks:
console errors, uncaught exceptions, every network request, the ``data-field`` elements, and a
full-page screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe",
]  # fmt: skip

#: Every element with a data-field: its path, its text, and whether it is laid out visibly.
FIELDS_JS = """JSON.stringify([...document.querySelectorAll('[data-field]')].map(e => {
  const r = e.getBoundingClientRect();
  return [e.dataset.field, e.textContent, r.width > 0 && r.height > 0];
}))"""


class CDPError(RuntimeError):
    pass


@dataclass
class Loaded:
    url: str
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    fields: list[tuple[str, str, bool]] = field(default_factory=list)
    first_banner: dict[str, Any] | None = None
    screenshot: bytes = b""


class Browser:
    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="speclens-chromium-")
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()

        def pipe_fds() -> None:  # in the child: the pipe ends on fds 3 and 4, where chromium looks
            read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.log_path = Path(self.profile) / "chromium.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                pass_fds=(3, 4), preexec_fn=pipe_fds, stdin=subprocess.DEVNULL, stdout=log,
                stderr=log, start_new_session=True,
            )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._next = 0
        self._events: list[dict[str, Any]] = []
        self.version = self.send("Browser.getVersion")

    # -- the wire

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError(f"no reply from chromium in {self.timeout:.0f} s: {self._log()}")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise CDPError(f"chromium closed the pipe: {self._log()}")
                self._buf += chunk
        message, _, self._buf = self._buf.partition(b"\0")
        return dict(json.loads(message))

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:  # fmt: skip
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self._events.append(reply)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        seen = 0
        while True:
            for event in self._events[seen:]:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            seen = len(self._events)
            self._events.append(self._read_message(deadline))

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    # -- a page

    def load(self, path: Path, width: int = 1280) -> Loaded:
        """Open ``path`` in a new tab, wait for its load event, and read it back."""
        url = path.resolve().as_uri()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.send(f"{domain}.enable", session=session)
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                      session=session)  # fmt: skip
            start = len(self._events)
            self.send("Page.navigate", {"url": url}, session=session)
            self.wait_event("Page.loadEventFired", session)
            self.send(
                "Runtime.evaluate", {"expression": "1", "awaitPromise": True}, session=session
            )
            loaded = Loaded(url)
            value = self._evaluate(FIELDS_JS, session)
            loaded.fields = [(p, t, bool(v)) for p, t, v in json.loads(value)]
            banner = self._evaluate(
                "(() => { const b = document.querySelector('.banner'); if (!b) return 'null';"
                " const r = b.getBoundingClientRect(); return JSON.stringify({top: r.top,"
                " text: b.textContent, cls: b.className}); })()", session)  # fmt: skip
            loaded.first_banner = json.loads(banner)
            loaded.screenshot = self._screenshot(session)
            self._collect(loaded, self._events[start:], session)
            return loaded
        finally:
            self.send("Target.closeTarget", {"targetId": target})

    def _evaluate(self, expression: str, session: str) -> str:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                           session=session)  # fmt: skip
        if "exceptionDetails" in result:
            raise CDPError(f"evaluate: {result['exceptionDetails']}")
        return str(result["result"]["value"])

    def _screenshot(self, session: str) -> bytes:
        metrics = self.send("Page.getLayoutMetrics", session=session)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000),
                "scale": 1}  # fmt: skip
        shot = self.send("Page.captureScreenshot",
                         {"format": "png", "clip": clip, "captureBeyondViewport": True},
                         session=session)  # fmt: skip
        return base64.b64decode(shot["data"])

    @staticmethod
    def _collect(loaded: Loaded, events: list[dict[str, Any]], session: str) -> None:
        for event in events:
            if event.get("sessionId") != session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                loaded.console_errors.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                loaded.console_errors.append(str(params["entry"].get("text"))[:500])
            elif method == "Runtime.exceptionThrown":
                loaded.exceptions.append(json.dumps(params.get("exceptionDetails"))[:500])
            elif method == "Network.requestWillBeSent":
                loaded.requests.append(str(params["request"]["url"]))

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(CDPError, OSError):
                self.send("Browser.close")
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)
