"""A WHATWG-conformant Server-Sent Events parser that takes bytes as they arrive.

Lines end in CRLF, LF or CR (a CR at the end of one read may pair with an LF at the start of the
next); ``data`` lines join with newlines; a single space after the colon is dropped; comments
(``:``) are ignored; an empty line dispatches the event; a leading BOM is skipped.
"""

from __future__ import annotations

from typing import NamedTuple


class Event(NamedTuple):
    """One dispatched event (a tuple: cheap to make, thousands of times a second)."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEParser:
    def __init__(self) -> None:
        self._buffer = ""
        self._pending_cr = False
        self._decoder_tail = b""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._started = False

    def feed(self, chunk: bytes) -> list[Event]:
        """Parse a read; return the events it completed."""
        raw = self._decoder_tail + chunk
        try:
            text = raw.decode("utf-8")
            self._decoder_tail = b""
        except UnicodeDecodeError as exc:  # a multi-byte character split across reads
            text = raw[: exc.start].decode("utf-8")
            self._decoder_tail = raw[exc.start :]
            if len(self._decoder_tail) > 4:  # not a split character: replace it
                text = raw.decode("utf-8", errors="replace")
                self._decoder_tail = b""
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        self._pending_cr = text.endswith("\r")
        self._buffer += text
        events: list[Event] = []
        buffer = self._buffer
        if "\r" in buffer:
            buffer = buffer.replace("\r\n", "\n").replace("\r", "\n")
        lines = buffer.split("\n")
        self._buffer = lines.pop()  # the unfinished line
        data = self._data
        for line in lines:
            if line.startswith("data: "):  # the common cases first
                data.append(line[6:])
                continue
            if not line and len(data) == 1 and not self._event:
                events.append(Event(data.pop(), "message", self._id, self._retry))
                continue
            event = self._line(line)
            if event is not None:
                events.append(event)
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
        self._event = ""
        return event
