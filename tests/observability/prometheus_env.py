"""Debian's prometheus for the observability tier: found on PATH, else installed with apt-get.

Run as a script (``make test-observability`` does) it installs the ``prometheus`` package (the
server and ``promtool``) when either is missing, and fails loudly when it cannot (not root, no
apt-get, the install failing): the tier is never skipped. The package's own service is not used:
the tests start their own server on loopback with a configuration of their own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, run as a script too
from aptkit import ensure, install_command

INSTALL = install_command("prometheus")


def binaries() -> tuple[str, str] | None:
    """``(prometheus, promtool)`` when both are on PATH."""
    server, tool = shutil.which("prometheus"), shutil.which("promtool")
    return (server, tool) if server and tool else None


def ensure_prometheus() -> tuple[str, str]:
    """``(prometheus, promtool)``, installed first when missing; SystemExit saying why not. No
    service start from the package's maintainer scripts: the tests run their own server."""
    return ensure("observability tier", "prometheus", binaries, {"RUNLEVEL": "1"})


def version(path: str) -> str:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return (
        (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else ""
    )


if __name__ == "__main__":
    server, tool = ensure_prometheus()
    print(f"observability tier: {server}: {version(server)}")
    print(f"observability tier: {tool}: {version(tool)}")
    sys.exit(0)
