"""A parser of server-sent events (text/event-stream), as the HTML standard
defines them, fed with bytes as they arrive.

Lines end in LF, CRLF or CR (a CR at the end of one read may be followed by
the LF of the next); a line starting with ":" is a comment (the server's
keep-alives); "field: value" drops one space after the colon; the data lines
of one event are joined with LF; an empty line ends an event; an event
without data is none; a byte order mark may start the stream; ``id`` sets
the stream's last event id (also from a block without data, which is no
event), which each event carries and :attr:`SSEParser.last_id` keeps, for
reconnecting; ``retry`` and unknown fields are ignored; the unfinished event
at the end of the stream is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

from .errors import SbxError

# MAX_LINE bounds one line. A result event carries an execution's whole
# output, which the server caps, so the bound is generous.
MAX_LINE = 512 << 20


@dataclass
class Event:
    """One server-sent event: its name ("message" when it names none) and
    its data lines joined with LF."""

    name: str
    data: str
    id: str = ""


class SSEParser:
    """Turns the bytes of an event stream into events::

        p = SSEParser()
        for chunk in chunks:
            for ev in p.feed(chunk):
                ...
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._started = False
        self._cr_pending = False  # the last read ended in CR: skip an LF next
        self._scanned = 0
        self._name = ""
        self._data: List[str] = []
        self._has_data = False
        self.last_id = ""

    def feed(self, chunk: bytes) -> List[Event]:
        """Adds bytes of the stream; returns the events they complete."""
        out: List[Event] = []
        if not chunk:
            return out
        if self._cr_pending:
            self._cr_pending = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf
        buf += chunk
        start = 0
        n = len(buf)
        # Bytes before _scanned hold no line end (a long line arrives in
        # many reads: do not search it again each time).
        scan = self._scanned
        lf = cr = -2  # where the next LF and CR are (-1: none left), -2: unknown
        while start < n:
            if lf == -2 or 0 <= lf < scan:
                lf = buf.find(b"\n", scan)
            if cr == -2 or 0 <= cr < scan:
                cr = buf.find(b"\r", scan)
            if lf < 0 and cr < 0:
                break
            if cr < 0 or (0 <= lf < cr):
                end, nxt = lf, lf + 1
            elif cr + 1 < n:
                end, nxt = cr, cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1
            else:
                # A CR that ends this read: the line is over, and an LF at
                # the start of the next read belongs to it.
                end, nxt = cr, cr + 1
                self._cr_pending = True
            ev = self._line(bytes(buf[start:end]))
            if ev is not None:
                out.append(ev)
            start = scan = nxt
        del buf[:start]
        self._scanned = len(buf)
        if len(buf) > MAX_LINE:
            raise SbxError(f"event stream: a line longer than {MAX_LINE} bytes")
        return out

    def _line(self, raw: bytes) -> Optional[Event]:
        line = raw.decode("utf-8", "replace")
        if not self._started:
            self._started = True
            if line.startswith("\ufeff"):
                line = line[1:]
        if line == "":
            if not self._has_data:
                self._name = ""
                return None
            ev = Event(self._name or "message", "\n".join(self._data), self.last_id)
            self._name, self._data, self._has_data = "", [], False
            return ev
        if line[0] == ":":
            return None
        fld, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if fld == "event":
            self._name = value
        elif fld == "data":
            self._data.append(value)
            self._has_data = True
        elif fld == "id" and "\0" not in value:
            self.last_id = value
        return None


def json_events(resp: Any, what: str) -> Iterator[Tuple[str, Any]]:
    """Yields the events of an answer that must be an event stream, as
    (name, data decoded as JSON), as they arrive; ``what`` names the call in
    errors."""
    ctype = (resp.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if ctype != "text/event-stream":
        raise SbxError(f"{what}: the server answered with {ctype!r}, not an event stream", status=resp.status)
    parser = SSEParser()
    for chunk in resp.chunks():
        for ev in parser.feed(chunk):
            try:
                data = json.loads(ev.data)
            except ValueError as e:
                raise SbxError(f"{what}: event {ev.name}: {e}") from e
            yield ev.name, data
