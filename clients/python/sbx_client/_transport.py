"""HTTP for the sbx client: http.client with kept-alive connections.

Why not urllib: urllib opens a connection (and, for https, a TLS handshake)
per request, and an agent makes many small calls; here idle connections are
kept for the next call. A connection that the server (or a proxy) closed
while it sat idle is noticed before it is used; a request that fails on a
reused connection before the server can have acted on it is sent again once
on a new one.
"""

from __future__ import annotations

import http.client
import json
import select
import ssl
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import errors

USER_AGENT = "sbx-python-client"

# Connections idle longer than this are not reused: the server closes idle
# connections after 2 minutes, proxies often sooner.
_MAX_IDLE_SECONDS = 20.0
_MAX_IDLE_CONNS = 8
_MAX_ERROR_BODY = 64 << 10
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
# Errors that on a reused connection mean the server closed it before it
# read the request.
_STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, http.client.RemoteDisconnected)

Body = Union[None, bytes, Iterable[bytes]]
Query = Optional[Mapping[str, Any]]


def segment(what: str, value: str) -> str:
    """One path segment for an id: ids are never empty, "." or ".."."""
    if not isinstance(value, str) or value in ("", ".", ".."):
        raise errors.InvalidArgument(f"{what} {value!r}: want a non-empty id")
    return urllib.parse.quote(value, safe="")


def file_path(path: str) -> str:
    """A workspace-relative path for the URL, each segment escaped on its
    own. Leading and trailing slashes are dropped ("/data/" is "data");
    empty, "." and ".." segments are refused, since the server would
    redirect such a URL instead of answering it."""
    trimmed = path.strip("/") if isinstance(path, str) else ""
    if not trimmed:
        raise errors.InvalidArgument(f"path {path!r}: want a workspace-relative path like dir/data.csv")
    segs = trimmed.split("/")
    for s in segs:
        if s in ("", ".", ".."):
            raise errors.InvalidArgument(f'path {path!r}: empty, "." and ".." segments are not allowed')
    return "/".join(urllib.parse.quote(s, safe="") for s in segs)


def _query_string(query: Query) -> str:
    if not query:
        return ""
    pairs: List[Tuple[str, str]] = []
    for k, v in query.items():
        values = v if isinstance(v, (list, tuple)) else [v]
        for x in values:
            if x is None:
                continue
            if isinstance(x, bool):
                x = "true" if x else "false"
            pairs.append((k, str(x)))
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


class Response:
    """An answer whose status was one of those wanted. Read it whole with
    :meth:`read`, or in pieces with :meth:`chunks`; then the connection goes
    back to the pool. Closing it early closes the connection."""

    def __init__(self, transport: "Transport", conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self._t = transport
        self._conn: Optional[http.client.HTTPConnection] = conn
        self.raw = resp
        self.status = resp.status
        self.headers = resp.headers

    def read(self) -> bytes:
        try:
            data = self.raw.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise errors.TransportError(f"reading the answer: {e}") from e
        self._release()
        return data

    def chunks(self, size: int = 64 << 10) -> Iterator[bytes]:
        """Yields the body as it arrives (at most size bytes at a time)."""
        try:
            while True:
                try:
                    b = self.raw.read1(size)
                except (OSError, http.client.HTTPException) as e:
                    raise errors.TransportError(f"reading the answer: {e}") from e
                if not b:
                    break
                yield b
        except BaseException:
            self.close()
            raise
        self._release()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.raw.will_close or not self.raw.isclosed():
            conn.close()
        else:
            self._t._put(conn)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self.raw.close()
            conn.close()

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Transport:
    """Sends requests to one server; safe for concurrent use by threads."""

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str] = None,
        timeout: float = 60.0,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url {base_url!r}: want http://HOST[:PORT][/PATH] or https://...")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self._ssl = ssl_context if ssl_context is not None else (ssl.create_default_context() if self._https else None)
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()
        # Seams for tests of waits and backoff.
        self._sleep = time.sleep
        self._clock = time.monotonic

    def close(self) -> None:
        """Closes the idle connections. The client stays usable."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def _new(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _get(self, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, bool]:
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            if now - since > _MAX_IDLE_SECONDS or _dropped(conn):
                conn.close()
                continue
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn, True
        return self._new(timeout), False

    def _put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < _MAX_IDLE_CONNS:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        body: Body = None,
        headers: Optional[Dict[str, str]] = None,
        ok: Sequence[int] = (200,),
        timeout: Optional[float] = None,
    ) -> Response:
        """Sends a request of path (escaped already) under the base URL and
        returns the answer if its status is one of ok; else raises the
        error the server answered with. timeout is the socket timeout
        (default the client's): how long the server may stay silent."""
        url = self._prefix + path + _query_string(query)
        hdrs = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.api_key:
            hdrs["Authorization"] = "Bearer " + self.api_key
        if headers:
            hdrs.update(headers)
        if timeout is None:
            timeout = self.timeout
        replayable = body is None or isinstance(body, (bytes, bytearray))
        what = f"{method} {path}"
        while True:
            conn, reused = self._get(timeout)
            broken = False  # the request could not be sent whole
            try:
                conn.request(method, url, body=body, headers=hdrs)
            except (OSError, http.client.HTTPException) as e:
                # The server may have answered before it read the whole body
                # (an upload over the size limit), and closed.
                broken = True
                resp = _early_answer(conn, e)
                if resp is None:
                    conn.close()
                    if reused and replayable and isinstance(e, _STALE):
                        continue  # the request never got there whole
                    raise errors.TransportError(f"{what}: sending the request: {e}") from e
            except BaseException:
                conn.close()  # the body's reader failed, or an interrupt
                raise
            else:
                try:
                    resp = conn.getresponse()
                except (OSError, http.client.HTTPException) as e:
                    conn.close()
                    if reused and replayable and method in _IDEMPOTENT and isinstance(e, _STALE):
                        continue
                    raise errors.TransportError(f"{what}: {e}") from e
            break
        if resp.status in ok and not broken:
            return Response(self, conn, resp)
        try:
            data = resp.read(_MAX_ERROR_BODY)
        except (OSError, http.client.HTTPException):
            data = b""
        if broken and resp.status in ok:
            conn.close()
            raise errors.TransportError(f"{what}: the server answered {resp.status} before it had the whole request")
        if resp.isclosed() and not resp.will_close and not broken:
            self._put(conn)
        else:
            conn.close()
        raise errors.error_from_response(resp.status, data, resp.headers.get("Retry-After"))

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        body: Any = None,
        ok: Sequence[int] = (200,),
        timeout: Optional[float] = None,
    ) -> Tuple[int, Any]:
        """Sends a JSON request (body, if not None) and returns the status
        and the decoded JSON answer (None for an empty one)."""
        data = None
        headers = {}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        resp = self.request(method, path, query=query, body=data, headers=headers, ok=ok, timeout=timeout)
        return resp.status, decode_json(resp.read(), f"{method} {path}", resp.status)


def decode_json(raw: bytes, what: str, status: int) -> Any:
    """Decodes a JSON answer (None for an empty one)."""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise errors.SbxError(f"{what}: the answer is not JSON: {raw[:200]!r}", status=status, code="internal") from e


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by the other end: an idle
    connection that is readable has an EOF (or junk) waiting."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):
            p = select.poll()
            p.register(sock, select.POLLIN)
            return bool(p.poll(0))
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r)
    except (OSError, ValueError):
        return True


def _early_answer(conn: http.client.HTTPConnection, err: BaseException) -> Optional[http.client.HTTPResponse]:
    if not isinstance(err, (BrokenPipeError, ConnectionResetError)):
        return None
    try:
        return conn.getresponse()
    except (OSError, http.client.HTTPException):
        return None
