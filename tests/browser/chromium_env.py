"""Debian's chromium for the browser tier: found on PATH, else installed with apt-get.

Run as a script (``make test-browser`` does) it installs chromium when it is missing and fails
loudly when it cannot (not root, no apt-get, the install failing): the tier is never skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, run as a script too
from aptkit import ensure, install_command

INSTALL = install_command("chromium")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def ensure_chromium() -> str:
    """The chromium executable, installed first when missing; SystemExit saying why not."""
    return ensure("browser tier", "chromium", chromium)


if __name__ == "__main__":
    path = ensure_chromium()
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    print(f"browser tier: {path}: {version.stdout.strip() or version.stderr.strip()}")
    sys.exit(0)
