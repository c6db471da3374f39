"""The bench client on a hostile wire (issue 19, part C, and the files of item 7): redirects are
never followed, a base URL is checked and its credentials never written, a gzip bomb is bounded
in decoded bytes and in time, a request the server never received is sent again, and the run's
files are never written through a symbolic link."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from garbage_server import GarbageServer, Reply, Request, sse

from speclens.bench.client import LoadConfig, LoadGenerator
from speclens.bench.datasets import Prompt

pytestmark = pytest.mark.timeout(120)

CHUNK = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
OK = Reply(chunks=sse(CHUNK, CHUNK))


def bench(run_cli: Any, url: str, out: Path, *extra: str | Path) -> tuple[int, str, str]:
    return run_cli(
        "bench", "--url", url, "--model", "m", "--num-requests", "2", "--concurrency", "1",
        "--max-tokens", "2", "--output-dir", out, *extra,
    )  # fmt: skip


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def posts(server: GarbageServer) -> list[Request]:
    return [r for r in server.requests if r.method == "POST"]


# ---------------------------------------------------------------------------- 7: symbolic links


def test_a_symlinked_records_file_is_refused_before_any_request(
    run_cli: Any, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").symlink_to(target)
    with GarbageServer(OK) as server:
        code, _, stderr = bench(run_cli, server.url, out, "--backend", "openai")
        sent = len(posts(server))
    assert code == 2
    assert "records.jsonl" in stderr and "symbolic link" in stderr, stderr
    assert target.read_text() == "keep me\n"
    assert sent == 0


def test_a_symlinked_summary_is_never_written_through(run_cli: Any, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").symlink_to(target)
    with GarbageServer(OK) as server:
        code, stdout, stderr = bench(run_cli, server.url, out, "--backend", "openai")
    assert code != 0
    assert "summary.json" in stdout + stderr and "symbolic link" in stdout + stderr
    assert target.read_text() == "keep me\n"


# ---------------------------------------------------------------------------- 8: redirects


def test_a_redirect_is_a_failure_naming_its_location_and_never_followed(
    run_cli: Any, tmp_path: Path
) -> None:
    with GarbageServer(OK) as other:
        moved = Reply(307, headers={"Location": other.url + "/v1/completions"}, body=b"")
        found = Reply(302, headers={"Location": other.url + "/props"}, body=b"")
        gets = {p: found for p in ("/props", "/get_model_info", "/get_server_info", "/version",
                                   "/metrics", "/debug/mtp_stats")}  # fmt: skip
        with GarbageServer(moved, get=gets) as server:
            code, _, _ = bench(run_cli, server.url, tmp_path)
        reached = list(other.requests)
    assert reached == []  # no prompt, no probe, no scrape went to the other origin
    assert code == 3
    errors = {row["error"] for row in rows(tmp_path)}
    assert errors == {f"HTTP 307: a redirect to '{other.url}/v1/completions', not followed"}


# ---------------------------------------------------------------------------- 9: the base URL


def test_a_trailing_v1_is_dropped_and_said(run_cli: Any, tmp_path: Path) -> None:
    with GarbageServer(OK) as server:
        code, _, stderr = bench(run_cli, server.url + "/v1/", tmp_path, "--backend", "openai")
        paths = {r.path for r in posts(server)}
    assert code == 0, stderr
    assert paths == {"/v1/completions"}
    assert "dropped the trailing /v1" in stderr


@pytest.mark.parametrize(
    ("url", "why"),
    [("http://127.0.0.1:8000/?x=1", "a query"), ("http://127.0.0.1:8000?", "a query"),
     ("http://127.0.0.1:8000/#top", "a fragment"), ("http://127.0.0.1:0", "port 0")],
)  # fmt: skip
def test_a_query_a_fragment_and_port_0_are_refused(run_cli: Any, url: str, why: str) -> None:
    code, _, stderr = run_cli("bench", "--url", url, "--model", "m", "--num-requests", "2")
    assert code == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith(f"command line: --url: expected http(s)://HOST[:PORT], got {url!r}")
    assert why in line


# ---------------------------------------------------------------------------- 10: credentials

SECRET = "s3cr3t-pw"


def test_url_credentials_with_an_api_key_are_refused(run_cli: Any) -> None:
    url = f"http://user:{SECRET}@127.0.0.1:8000"
    code, stdout, stderr = run_cli(
        "bench", "--url", url, "--model", "m", "--num-requests", "2", "--api-key", "k"
    )
    assert code == 2
    assert "--api-key" in stderr and "user:***@" in stderr
    assert SECRET not in stdout + stderr


def test_url_credentials_are_basic_auth_and_never_written(run_cli: Any, tmp_path: Path) -> None:
    """The password reaches the server as basic auth, and no file or console line shows it:
    summary.json's settings, each records.jsonl line (replica and error), the console."""
    with GarbageServer([OK, Reply(500, body=b"no")]) as server:
        url = server.url.replace("//", f"//user:{SECRET}@")
        code, stdout, stderr = bench(run_cli, url, tmp_path, "--backend", "openai")
        auth = {r.headers.get("authorization") for r in posts(server)}
    assert code == 3  # the second request got a 500
    assert auth == {"Basic dXNlcjpzM2NyM3QtcHc="}  # user:s3cr3t-pw
    for path in tmp_path.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path.name
    assert SECRET not in stdout + stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    redacted = server.url.replace("//", "//user:***@")
    assert summary["settings"]["url"] == redacted
    assert {row["replica"] for row in rows(tmp_path)} == {redacted}


# ---------------------------------------------------------------------------- 11: gzip bombs


def gzip_bomb(decoded_mib: int, line: bytes = b":\n", chunk: int = 2**16) -> list[bytes]:
    """A gzip SSE stream of comment lines that inflates to ``decoded_mib`` MiB, cheap to make:
    after a full flush, deflate encodes each identical block the same way (the trailer is left
    off; the bounds act long before it would be checked)."""
    block = line * (2**20 // len(line))  # 1 MiB of ``line`` (an SSE or a metrics comment)
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    again = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    body = first + again * (decoded_mib - 1)
    return [body[i : i + chunk] for i in range(0, len(body), chunk)]


GZIP = {"Content-Encoding": "gzip"}


def test_a_gzip_bomb_is_bounded_in_decoded_bytes(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("speclens.bench.transport.MAX_STREAM_BYTES", 2**20)
    with GarbageServer(Reply(headers=GZIP, chunks=gzip_bomb(8))) as server:
        code, _, _ = bench(run_cli, server.url, tmp_path, "--backend", "openai")
    assert code == 3
    assert {row["error"] for row in rows(tmp_path)} == {
        "the response exceeded 1048576 decoded bytes"
    }


def test_a_gzip_bomb_cannot_outlast_the_timeout(run_cli: Any, tmp_path: Path) -> None:
    """2 GiB decoded: before the bound, --timeout 2 failed after tens of seconds with a bare
    "TimeoutError:"."""
    with GarbageServer(Reply(headers=GZIP, chunks=gzip_bomb(2048))) as server:
        began = time.perf_counter()
        code, _, _ = bench(
            run_cli, server.url, tmp_path, "--backend", "openai", "--timeout", "2",
            "--num-requests", "1",
        )  # fmt: skip
        took = time.perf_counter() - began
    assert code == 3
    (row,) = rows(tmp_path)
    assert row["error"] in {
        "timed out after 2 s reading the body",
        f"the response exceeded {256 * 2**20} decoded bytes",
    }
    assert took < 2 + 4  # the run's own start and end included


def test_a_timeout_names_what_it_was_waiting_for(run_cli: Any, tmp_path: Path) -> None:
    slow = Reply(chunks=[*sse(CHUNK, done=False), *sse(CHUNK)], chunk_delay=5)
    with GarbageServer(slow) as server:
        bench(run_cli, server.url, tmp_path, "--backend", "openai", "--timeout", "1",
              "--num-requests", "1")  # fmt: skip
    assert [row["error"] for row in rows(tmp_path)] == ["timed out after 1 s reading the body"]


def test_an_unknown_content_encoding_fails_the_request(run_cli: Any, tmp_path: Path) -> None:
    with GarbageServer(Reply(headers={"Content-Encoding": "br"}, chunks=sse(CHUNK))) as server:
        code, _, _ = bench(run_cli, server.url, tmp_path, "--backend", "openai")
    assert code == 3
    assert {row["error"] for row in rows(tmp_path)} == {
        "the response's Content-Encoding 'br' is not one of gzip, deflate"
    }


# ---------------------------------------------------------------------------- 12b: unwritten body


class ResetWhileWriting(GarbageServer):
    """Answers a connection's first request (saying keep-alive); on the next request it reads
    the head only and resets the connection while the client is still writing the body, as
    llama-server closing a kept-alive connection does."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await super()._serve(reader, writer)
        await reader.readuntil(b"\r\n\r\n")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST: the body the client is writing goes nowhere


def test_a_request_whose_body_could_not_be_written_is_sent_again() -> None:
    """Each prompt is 8 MiB, more than the loopback buffers hold, so the reset meets the client
    mid-body: "ClientOSError: Can not write request body" lost the request before the fix."""
    reply = Reply(headers={"Connection": "keep-alive"}, chunks=sse(CHUNK, CHUNK))
    prompts = [Prompt("x" * 2**23, "big")]
    config = LoadConfig(url="", model="m", num_requests=4, concurrency=1, max_tokens=2, timeout=60)
    with ResetWhileWriting(reply) as server:
        config.url = server.url
        result = asyncio.run(LoadGenerator(config, prompts).run())
        answered = len(posts(server))
    assert [r.error for r in result.records] == [None] * 4
    assert answered == 4  # each answered once: the reset attempts got no response


def test_only_a_request_the_server_never_received_is_sent_again() -> None:
    """The write-side message llama-server's close produced (b11434) is resent; a connection
    never made, or a reply that began, is not. Mutation killed: retrying only
    ``ServerDisconnectedError``."""
    from aiohttp import ClientConnectorError, ClientOSError, ServerDisconnectedError
    from aiohttp.client_reqrep import ConnectionKey

    from speclens.bench.transport import _unsent

    key = ConnectionKey("h", 1, False, True, None, None, None)
    assert _unsent(ClientOSError(32, "Can not write request body for http://h/v1/completions"))
    assert _unsent(ServerDisconnectedError())
    assert not _unsent(ClientConnectorError(key, OSError(111, "refused")))
    assert not _unsent(ClientOSError(None, "something else"))


# ---------------------------------------------------------------------------- scrapes


def test_a_gzip_bomb_on_metrics_and_version_is_bounded_in_memory() -> None:
    """The scrapes decode as the client does (bounded slices), not through aiohttp's decoder:
    one 256 KiB network chunk of this body inflates to about 256 MiB at once there."""
    import tracemalloc

    from speclens.bench.server import MAX_BODY, read_counters, server_info

    bomb = Reply(headers=GZIP, chunks=gzip_bomb(1024, line=b"#\n", chunk=2**18))
    with GarbageServer(Reply(), get={"/metrics": bomb, "/version": bomb}) as server:
        tracemalloc.start()
        try:
            counters, why = asyncio.run(read_counters(server.url))
            info = asyncio.run(server_info(server.url))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert counters is None and why == "the server exposes no acceptance counters"
    assert info is None
    assert peak < 4 * MAX_BODY, f"peak {peak / 2**20:.0f} MiB"


def test_an_unknown_encoding_on_metrics_is_no_counters_not_a_crash() -> None:
    from speclens.bench.server import read_counters

    odd = Reply(headers={"Content-Encoding": "br"}, body=b"vllm:spec_decode_num_drafts_total 3\n")
    with GarbageServer(Reply(), get={"/metrics": odd}) as server:
        counters, why = asyncio.run(read_counters(server.url))
    assert counters is None and why == "the server exposes no acceptance counters"
