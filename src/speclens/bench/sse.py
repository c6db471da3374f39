"""A WHATWG-conformant Server-Sent Events parser that takes bytes as they arrive.

Lines end in CRLF, LF or CR (a CR at the end of one read may pair with an LF at the start of the
next); ``data`` lines join with newlines; a single space after the colon is dropped; comments
(``:``) are ignored; an empty line dispatches the event; a leading BOM is skipped. Bytes that
are not UTF-8 become U+FFFD, as the standard says, and the events do not depend on how the bytes
were split into reads. An event (or an unfinished line) longer than ``max_event_chars`` raises
``SSEError``, so a server cannot make the client buffer without bound.

Each character is scanned once: a read without a line end is only appended to the unfinished
line (a list of pieces, joined when its line ends), so a long line sent in small reads costs time
in proportion to its length, not its square.
"""

from __future__ import annotations

import codecs
from typing import NamedTuple

#: The largest event the client buffers (characters): far above any completion chunk.
MAX_EVENT_CHARS = 16 * 2**20


class SSEError(ValueError):
    """The stream cannot be parsed within the client's bounds."""


class Event(NamedTuple):
    """One dispatched event (a tuple: cheap to make, thousands of times a second)."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEParser:
    def __init__(self, max_event_chars: int = MAX_EVENT_CHARS) -> None:
        self.max_event_chars = max_event_chars
        self._pieces: list[str] = []  # the unfinished line, in pieces
        self._pending = 0  # characters in self._pieces
        self._pending_cr = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._data: list[str] = []
        self._size = 0  # characters in self._data
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._started = False

    def feed(self, chunk: bytes) -> list[Event]:
        """Parse a read; return the events it completed."""
        text = self._decoder.decode(chunk)  # keeps a multi-byte character split across reads
        if not text:  # nothing decoded yet: a pending CR must stay pending
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = text.endswith("\r")
        if "\n" not in text and "\r" not in text:  # the unfinished line goes on: scan no more
            self._pieces.append(text)
            self._pending += len(text)
            if self._pending > self.max_event_chars:
                raise SSEError(f"an SSE event exceeds {self.max_event_chars} characters")
            return []
        if self._pieces:
            self._pieces.append(text)
            text = "".join(self._pieces)
            self._pieces.clear()
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        rest = lines.pop()  # the unfinished line
        self._pieces = [rest] if rest else []
        self._pending = len(rest)
        events: list[Event] = []
        data = self._data
        for line in lines:
            if line.startswith("data: "):  # the common cases first
                data.append(line[6:])
                self._size += len(line)
                continue
            if not line and len(data) == 1 and not self._event:
                events.append(Event(data.pop(), "message", self._id, self._retry))
                self._size = 0
                continue
            event = self._line(line)
            if event is not None:
                events.append(event)
        if max(self._pending, self._size) > self.max_event_chars:
            raise SSEError(f"an SSE event exceeds {self.max_event_chars} characters")
        return events

    def _line(self, line: str) -> Event | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._size += len(value) + 1
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> Event | None:
        if not self._data:
            self._event = ""
            return None
        event = Event("\n".join(self._data), self._event or "message", self._id, self._retry)
        self._data.clear()  # in place: feed() holds a reference
        self._size = 0
        self._event = ""
        return event
