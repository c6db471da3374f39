"""A local Ray (``sim --ray`` alone) is reachable from this machine only: every socket that its
processes (the driver, ``gcs_server``, ``raylet``, agents, workers) listen on is a loopback one.
Ray on Linux otherwise listens on every interface, with no authentication, for the whole run.

The run happens in a child process (this file run as a script), which lists the listening
sockets of itself and its descendants while its tasks run, from ``/proc``."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc"),
]


def _descendants(root: int) -> list[int]:
    """``root`` and every process under it."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(proc.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _sockets(pid: int) -> set[str]:
    """The inodes of the sockets ``pid`` holds."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> str:
    """An address of ``/proc/net/tcp*`` (32-bit words in host order) as text."""
    raw = bytes.fromhex(hex_address)
    host_order = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(host_order))


def _bound() -> dict[str, tuple[str, str, int]]:
    """Every listening TCP socket and every bound UDP socket: inode -> (kind, address, port)."""
    table = {}
    for kind in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{kind}").read_text().splitlines()[1:]:
            fields = line.split()
            if kind.startswith("tcp") and fields[3] != "0A":  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            table[fields[9]] = (kind, _address(address), int(port, 16))
    return table


def listeners() -> list[tuple[int, str, str, str, int]]:
    """(pid, name, kind, address, port) for each socket this process and its descendants
    listen on."""
    table = _bound()
    found = []
    for pid in _descendants(os.getpid()):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        found.extend((pid, name, *table[i]) for i in _sockets(pid) if i in table)
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def test_a_local_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    # files, not pipes: a Ray process left holding a pipe would keep the run waiting for it
    with out.open("wb") as stdout, err.open("wb") as stderr:
        code = subprocess.run([sys.executable, __file__], env=env, stdout=stdout, stderr=stderr,
                              timeout=240).returncode  # fmt: skip
    assert code == 0, err.read_text(errors="replace")[-3000:]
    seen = [tuple(entry) for entry in json.loads(out.read_text().strip().splitlines()[-1])]
    names = {entry[1] for entry in seen}
    assert {"gcs_server", "raylet"} <= names, f"no listener of Ray's own seen: {seen}"
    exposed = sorted({entry for entry in seen if not _loopback(entry[3])})
    assert not exposed, f"a local Ray listens beyond loopback: {exposed}"


def _run() -> None:
    """The child: four calls on a local Ray of 2 CPUs, the listeners seen as each result
    arrives (while the Ray runs), printed as one JSON line."""
    from speclens.sim import fanout

    seen: set[tuple[int, str, str, str, int]] = set()

    def record(_i: int, result: str) -> str:
        seen.update(listeners())
        return result

    paths = ["a/b", "c/d", "e/f", "g/h"]
    results = fanout.run(os.path.basename, paths, 2, ray_address=fanout.LOCAL, on_result=record)
    assert results == ["b", "d", "f", "h"]
    print(json.dumps(sorted(seen)))


if __name__ == "__main__":
    _run()
