"""A WHATWG-conformant Server-Sent Events parser that takes bytes as they arrive.

Lines end in CRLF, LF or CR (a CR at the end of one read may pair with an LF at the start of the
next); ``data`` lines join with newlines; a single space after the colon is dropped; comments
(``:``) are ignored; an empty line dispatches the event; a leading BOM is skipped. The events do
not depend on how the bytes were split into reads. An event (or an unfinished line) longer than
``max_event_chars`` raises ``SSEError``, so a server cannot make the client buffer without
bound (counted in bytes: a character is one to four, so the bound only tightens).

It works on the bytes: the line ends and field names are ASCII, which no UTF-8 sequence (nor a
broken one) holds, so splitting before decoding gives the standard's result. ``feed_data`` hands
each event's data on as bytes (the client's JSON parser reads them, and the record keeps them
as they came); ``feed`` decodes them, invalid UTF-8 becoming U+FFFD as the standard says.

Each byte is scanned a bounded number of times: a read without a line end is only appended to
the unfinished line (a list of pieces, joined when its line ends), so a long line sent in small
reads costs time in proportion to its length, not its square. An event that is one ``data: ``
line, the form every engine sends, is cut out of its block whole.
"""

from __future__ import annotations

from typing import NamedTuple

#: The largest event the client buffers (bytes): far above any completion chunk.
MAX_EVENT_CHARS = 16 * 2**20

_BOM = b"\xef\xbb\xbf"


class SSEError(ValueError):
    """The stream cannot be parsed within the client's bounds."""


class Event(NamedTuple):
    """One dispatched event (a tuple: cheap to make, thousands of times a second)."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


#: An event as parsed: (data, type, id, retry), still bytes.
_Raw = tuple[bytes, bytes, bytes | None, int | None]


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class SSEParser:
    def __init__(self, max_event_chars: int = MAX_EVENT_CHARS) -> None:
        self.max_event_chars = max_event_chars
        self._pieces: list[bytes] = []  # the unfinished line, in pieces
        self._pending = 0  # bytes in self._pieces
        self._pending_cr = False
        self._head = b""  # the first bytes, until they are known not to be a BOM's start
        self._started = False
        self._data: list[bytes] = []
        self._size = 0  # bytes in self._data
        self._event = b""
        self._id: bytes | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        """Parse a read; return the events it completed."""
        return [
            Event(_text(data), _text(kind) if kind else "message",
                  None if id_ is None else _text(id_), retry)
            for data, kind, id_, retry in self._feed(chunk)
        ]  # fmt: skip

    def feed_data(self, chunk: bytes) -> list[bytes]:
        """Parse a read; return the data of each event it completed, as bytes (not decoded)."""
        return [event[0] for event in self._feed(chunk)]

    def _feed(self, chunk: bytes) -> list[_Raw]:
        if not self._started:
            chunk = self._start(chunk)
        if not chunk:
            return []
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._pending_cr = chunk.endswith(b"\r")
        if b"\n" not in chunk and b"\r" not in chunk:  # the unfinished line goes on: scan no more
            if chunk:
                self._pieces.append(chunk)
                self._pending += len(chunk)
                if self._pending > self.max_event_chars:
                    raise SSEError(f"an SSE event exceeds {self.max_event_chars} characters")
            return []
        if self._pieces:
            self._pieces.append(chunk)
            chunk = b"".join(self._pieces)
            self._pieces.clear()
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[_Raw] = []
        blocks = chunk.split(b"\n\n")  # each block: its lines, then the empty line
        rest = blocks.pop()
        for block in blocks:
            if (
                not self._data
                and not self._event
                and block.startswith(b"data: ")
                and b"\n" not in block
            ):
                events.append((block[6:], b"", self._id, self._retry))
                continue
            for line in block.split(b"\n"):
                self._line(line, events)
            self._line(b"", events)
        lines = rest.split(b"\n")
        last = lines.pop()  # the unfinished line
        for line in lines:
            self._line(line, events)
        self._pieces = [last] if last else []
        self._pending = len(last)
        if max(self._pending, self._size) > self.max_event_chars:
            raise SSEError(f"an SSE event exceeds {self.max_event_chars} characters")
        return events

    def _start(self, chunk: bytes) -> bytes:
        """The stream's first bytes without a leading BOM (held back while they could be one)."""
        head = self._head + chunk
        if len(head) < len(_BOM) and _BOM.startswith(head):
            self._head = head
            return b""
        self._started = True
        self._head = b""
        return head.removeprefix(_BOM)

    def _line(self, line: bytes, events: list[_Raw]) -> None:
        if line == b"":
            if self._data:
                events.append((b"\n".join(self._data), self._event, self._id, self._retry))
                self._data.clear()
                self._size = 0
            self._event = b""
            return
        if line.startswith(b":"):
            return
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._size += len(value) + 1
            if self._size > self.max_event_chars:
                raise SSEError(f"an SSE event exceeds {self.max_event_chars} characters")
        elif name == b"event":
            self._event = value
        elif name == b"id" and b"\x00" not in value:
            self._id = value
        elif name == b"retry" and value.isdigit():
            self._retry = int(value)
