"""Debian's prometheus for the observability tier: found on PATH, else installed with apt-get.

Run as a script (``make test-observability`` does) it installs the ``prometheus`` package (the
server and ``promtool``) when either is missing, and fails loudly when it cannot (not root, no
apt-get, the install failing): the tier is never skipped. The package's own service is not used:
the tests start their own server on loopback with a configuration of their own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

INSTALL = ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"]


def binaries() -> tuple[str, str] | None:
    """``(prometheus, promtool)`` when both are on PATH."""
    server, tool = shutil.which("prometheus"), shutil.which("promtool")
    return (server, tool) if server and tool else None


def ensure_prometheus() -> tuple[str, str]:
    """``(prometheus, promtool)``, installed first when missing; SystemExit saying why not."""
    found = binaries()
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise SystemExit(
            "observability tier: prometheus is not installed and apt-get is not available"
        )
    if os.geteuid() != 0:
        raise SystemExit(
            f"observability tier: prometheus is not installed; run as root: {' '.join(INSTALL)}"
        )
    # No service start from the package's maintainer scripts: the tests run their own server.
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "RUNLEVEL": "1"}
    if subprocess.run(INSTALL, env=env, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=False)
        if subprocess.run(INSTALL, env=env, check=False).returncode != 0:
            raise SystemExit(f"observability tier: {' '.join(INSTALL)} failed")
    found = binaries()
    if not found:
        raise SystemExit("observability tier: prometheus installed but not found on PATH")
    return found


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
