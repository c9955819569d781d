"""Executions: asynchronous, synchronous and streamed (R-10..R-14).

Why :meth:`execute` submits and then long-polls instead of one
``POST /execute?wait=true``: a synchronous POST holds one connection for the
whole run (a step may run for minutes), and if that connection breaks the
execution runs on with no id to fetch its result by. Submitting first gives
the id at once; ``GET /executions/{id}/result?wait=true&timeout=T`` then
blocks on the server until the run is over or T passes, so the result comes
back as soon as it exists, no poll is wasted while the server waits, and a
broken poll is simply repeated. Polls that come back early without the result
(a server or proxy that does not hold the request) and transient errors are
spaced by exponential backoff, so a client never hammers the server.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Mapping, Optional

from . import errors, models
from ._sessions import _session_path
from ._transport import Transport, segment
from .sse import SSEParser

P = "/api/v1"

# Long-poll window of one result request: below common proxy idle limits.
POLL_WINDOW = 30.0
# Backoff between polls that came back early, and after transient errors.
POLL_MIN_DELAY = 0.05
POLL_MAX_DELAY = 2.0
# Transient errors (503, 429, a broken connection) in a row before a wait
# gives up.
POLL_MAX_FAILURES = 8
# The server sends a keep-alive comment every 15 s on a quiet stream.
STREAM_MIN_TIMEOUT = 45.0

SANDBOX_UNAVAILABLE = "SandboxUnavailable"

OutputCallback = Callable[[str, str], Any]


def execution_body(
    code: str,
    language: Optional[str] = None,
    timeout: Optional[float] = None,
    event: Any = None,
    env_vars: Optional[Mapping[str, str]] = None,
    conversation_id: Optional[str] = None,
    context_id: Optional[str] = None,
) -> Dict[str, Any]:
    """The JSON body of an execute request; None fields are left out."""
    if not isinstance(code, str):
        raise errors.InvalidArgument(f"code: want a str, got {type(code).__name__}")
    body: Dict[str, Any] = {"code": code}
    for k, v in (
        ("language", language),
        ("timeout", timeout),
        ("event", event),
        ("env_vars", dict(env_vars) if env_vars is not None else None),
        ("conversation_id", conversation_id),
        ("context_id", context_id),
    ):
        if v is not None:
            body[k] = v
    return body


def _execution_path(execution_id: str, rest: str = "") -> str:
    return f"{P}/executions/{segment('execution id', execution_id)}{rest}"


class ExecutionsMixin:
    """Execution calls of :class:`sbx_client.Client`."""

    _t: Transport

    def submit(
        self,
        session_id: str,
        code: str,
        *,
        language: Optional[str] = None,
        timeout: Optional[float] = None,
        event: Any = None,
        env_vars: Optional[Mapping[str, str]] = None,
        conversation_id: Optional[str] = None,
        context_id: Optional[str] = None,
    ) -> str:
        """Starts an execution and returns its id at once; fetch the result
        with :meth:`wait_result` or :meth:`get_result`.

        Args:
            code: Python (a top-level ``return`` or ``handler(event)`` gives
                the result) or bash.
            language: "python" (default) or "bash".
            timeout: seconds before the run is killed (fractions allowed;
                default the template's).
            event: a JSON value passed to ``handler(event)``.
            env_vars: extra environment.
            conversation_id: run with that conversation's uploads in view at
                ``/workspace/uploads/temparea/``.
            context_id: run in a stateful interpreter context.
        """
        body = execution_body(code, language, timeout, event, env_vars, conversation_id, context_id)
        return self._submit(_session_path(session_id, "/execute"), body)

    def _submit(self, path: str, body: Dict[str, Any]) -> str:
        _, doc = self._t.call("POST", path, body=body, ok=(202,))
        return doc["execution_id"]

    def execute(
        self,
        session_id: str,
        code: str,
        *,
        language: Optional[str] = None,
        timeout: Optional[float] = None,
        event: Any = None,
        env_vars: Optional[Mapping[str, str]] = None,
        conversation_id: Optional[str] = None,
        context_id: Optional[str] = None,
        wait_timeout: Optional[float] = None,
    ) -> models.Execution:
        """Runs code and waits for the result (R-31): :meth:`submit`, then
        :meth:`wait_result`. A paused or hibernated session is resumed.

        The execution's own outcome is in the result (``status`` completed,
        failed, timeout or cancelled; ``error`` with the traceback); an
        exception means the call itself failed. When no sandbox can be had
        it raises :class:`Unavailable` (retry after ``retry_after``).
        ``wait_timeout`` bounds the wait (None: until the run is over, which
        its ``timeout`` bounds); past it, :class:`ResultNotReceived`. Other
        arguments as for :meth:`submit`.
        """
        eid = self.submit(
            session_id,
            code,
            language=language,
            timeout=timeout,
            event=event,
            env_vars=env_vars,
            conversation_id=conversation_id,
            context_id=context_id,
        )
        return self.wait_result(eid, timeout=wait_timeout)

    def wait_result(self, execution_id: str, timeout: Optional[float] = None) -> models.Execution:
        """Waits until the execution is over and returns it with its result.

        Long-polls the result endpoint (each request held by the server up
        to 30 s); a poll that comes back early without the result, a
        503/429 and a broken connection are retried after a pause that
        doubles from 50 ms up to 2 s (or the server's Retry-After), at most 8
        failures in a row. ``timeout`` bounds the whole wait (None: no
        bound); past it, :class:`ResultNotReceived`. An execution that never
        ran because no sandbox could be had raises :class:`Unavailable`.
        """
        clock, sleep = self._t._clock, self._t._sleep
        deadline = None if timeout is None else clock() + timeout
        delay = POLL_MIN_DELAY
        failures = 0
        while True:
            window = POLL_WINDOW
            if deadline is not None:
                remaining = deadline - clock()
                if remaining <= 0:
                    raise errors.ResultNotReceived(
                        f"execution {execution_id}: not over after {timeout} s", execution_id=execution_id
                    )
                window = min(window, remaining)
            started = clock()
            try:
                x = self.get_result(execution_id, wait=True, timeout=window)
            except (errors.Unavailable, errors.ResourceExhausted, errors.TransportError) as e:
                failures += 1
                if failures >= POLL_MAX_FAILURES:
                    if e.execution_id is None:
                        e.execution_id = execution_id
                    raise
                pause = e.retry_after if e.retry_after is not None else delay
                delay = min(delay * 2, POLL_MAX_DELAY)
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - clock()))
                sleep(pause)
                continue
            failures = 0
            if x.done:
                if x.error is not None and x.error.type == SANDBOX_UNAVAILABLE:
                    raise errors.Unavailable(
                        f"{x.error.message} (execution {execution_id})", status=503, execution_id=execution_id
                    )
                return x
            # The server held the poll as asked: poll again at once. It came
            # back early: wait out the backoff first.
            elapsed = clock() - started
            if elapsed < delay:
                pause = delay - elapsed
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - clock()))
                sleep(pause)
            delay = min(delay * 2, POLL_MAX_DELAY)

    def get_result(self, execution_id: str, wait: bool = False, timeout: Optional[float] = None) -> models.Execution:
        """Returns the execution with its output and result (once it is
        over). With ``wait`` the server holds the request until the
        execution is over or ``timeout`` seconds (default 60, at most 300)
        have passed, and then answers with the current state: one long
        poll. :meth:`wait_result` repeats it for you."""
        q: Dict[str, Any] = {}
        sock_timeout = None
        if wait:
            q["wait"] = True
            if timeout is not None:
                q["timeout"] = _seconds(timeout)
            sock_timeout = (timeout if timeout is not None else 60.0) + self._t.timeout
        _, doc = self._t.call("GET", _execution_path(execution_id, "/result"), query=q, timeout=sock_timeout)
        return models.from_dict(models.Execution, doc)

    def get_execution(self, execution_id: str) -> models.Execution:
        """Returns an execution's status and timings, without its output and
        result."""
        _, doc = self._t.call("GET", _execution_path(execution_id))
        return models.from_dict(models.Execution, doc)

    def cancel(self, execution_id: str) -> models.Execution:
        """Stops an execution's whole process tree; it ends as
        ``cancelled``. Cancelling one that is over changes nothing."""
        _, doc = self._t.call("POST", _execution_path(execution_id, "/cancel"))
        return models.from_dict(models.Execution, doc)

    def list_executions(
        self, session_id: str, *, limit: Optional[int] = None, page_token: Optional[str] = None
    ) -> models.ExecutionList:
        """Returns a page of the session's executions, newest first, without
        their output (``limit`` 1..1000, default 50)."""
        q = {"limit": limit, "page_token": page_token or None}
        _, doc = self._t.call("GET", _session_path(session_id, "/executions"), query=q)
        return models.from_dict(models.ExecutionList, doc)

    def execute_stream(
        self,
        session_id: str,
        code: str,
        on_output: Optional[OutputCallback] = None,
        *,
        language: Optional[str] = None,
        timeout: Optional[float] = None,
        event: Any = None,
        env_vars: Optional[Mapping[str, str]] = None,
        conversation_id: Optional[str] = None,
        context_id: Optional[str] = None,
    ) -> models.Execution:
        """Runs code, calls ``on_output(stream, text)`` with each piece of
        its output as it happens (stream is "stdout" or "stderr"), and
        returns the final execution (the ``result`` event).

        The answer is a server-sent event stream (``submitted``, ``stdout``
        and ``stderr`` events, then ``result`` or ``error``). An ``error``
        event raises its error (:class:`Unavailable` when no sandbox could be
        had); a stream that breaks before the result raises
        :class:`ResultNotReceived` naming the execution, whose result
        :meth:`wait_result` can still fetch. Other arguments as for
        :meth:`submit`.
        """
        body = execution_body(code, language, timeout, event, env_vars, conversation_id, context_id)
        return self._stream(_session_path(session_id, "/execute"), body, on_output)

    def _stream(self, path: str, body: Dict[str, Any], on_output: Optional[OutputCallback]) -> models.Execution:
        resp = self._t.request(
            "POST",
            path,
            body=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            timeout=max(self._t.timeout, STREAM_MIN_TIMEOUT),
        )
        with resp:
            ctype = (resp.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "text/event-stream":
                raise errors.SbxError(
                    f"execute: the server answered with {ctype!r}, not an event stream", status=resp.status
                )
            eid: Optional[str] = None
            parser = SSEParser()
            try:
                for chunk in resp.chunks():
                    for ev in parser.feed(chunk):
                        if ev.name == "submitted":
                            eid = _event_json(ev, eid).get("execution_id")
                        elif ev.name in ("stdout", "stderr"):
                            text = _event_json(ev, eid).get("text", "")
                            if on_output is not None:
                                on_output(ev.name, text)
                        elif ev.name == "result":
                            return models.from_dict(models.Execution, _event_json(ev, eid))
                        elif ev.name == "error":
                            e = _event_json(ev, eid).get("error") or {}
                            raise errors.error_from_code(
                                e.get("code") or "internal", e.get("message") or "", execution_id=eid
                            )
                        # Other events are for later versions of the API.
            except errors.TransportError as e:
                raise errors.ResultNotReceived(
                    f"execution {eid or '(not submitted)'}: reading the stream: {e.message}", execution_id=eid
                ) from e
        if eid is None:
            raise errors.ResultNotReceived("execute: the stream ended before the execution was submitted")
        raise errors.ResultNotReceived(f"execution {eid}: the stream ended before its result", execution_id=eid)


def _event_json(ev, eid: Optional[str]) -> Dict[str, Any]:
    try:
        doc = json.loads(ev.data)
    except ValueError as e:
        raise errors.SbxError(f"execution {eid}: event {ev.name}: {e}", execution_id=eid) from e
    if not isinstance(doc, dict):
        raise errors.SbxError(f"execution {eid}: event {ev.name}: not a JSON object", execution_id=eid)
    return doc


def _seconds(v: float) -> str:
    """Seconds for a query parameter: 60 -> "60", 0.5 -> "0.5"."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))
