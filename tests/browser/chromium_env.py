"""Debian's chromium for the browser tier: found on PATH, else installed with apt-get.

Run as a script (``make test-browser`` does) it installs chromium when it is missing and fails
loudly when it cannot (not root, no apt-get, the install failing): the tier is never skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

INSTALL = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def ensure_chromium() -> str:
    """The chromium executable, installed first when missing; SystemExit saying why not."""
    found = chromium()
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise SystemExit("browser tier: chromium is not installed and apt-get is not available")
    if os.geteuid() != 0:
        raise SystemExit(
            f"browser tier: chromium is not installed; run as root: {' '.join(INSTALL)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(INSTALL, env=env, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=False)
        if subprocess.run(INSTALL, env=env, check=False).returncode != 0:
            raise SystemExit(f"browser tier: {' '.join(INSTALL)} failed")
    found = chromium()
    if not found:
        raise SystemExit("browser tier: chromium installed but not found on PATH")
    return found


if __name__ == "__main__":
    path = ensure_chromium()
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    print(f"browser tier: {path}: {version.stdout.strip() or version.stderr.strip()}")
    sys.exit(0)
