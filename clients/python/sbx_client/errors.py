"""Exceptions of the sbx client.

Every exception the client raises for a failed call is an :class:`SbxError`.
An error the server answered with has the HTTP ``status``, the API's error
``code`` and ``message`` (from its ``{"error": {"code", "message"}}`` body)
and, for 429 and 503, ``retry_after``; its class says the category:

================================  ==========  =================================
class                             status      code
================================  ==========  =================================
:class:`InvalidArgument`          400, 416    ``invalid_argument``
:class:`Unauthenticated`          401         ``unauthenticated``
:class:`PermissionDenied`         403         ``permission_denied``
:class:`NotFound`                 404         ``not_found``
:class:`Conflict`                 409         ``already_exists``,
                                              ``failed_precondition``
:class:`PayloadTooLarge`          413         ``payload_too_large``
:class:`UnsupportedMediaType`     415         ``unsupported_media_type``
:class:`Unprocessable`            422         ``unprocessable``
:class:`ResourceExhausted`        429         ``resource_exhausted``
:class:`InternalError`            500         ``internal``
:class:`Unavailable`              502-504     ``unavailable``
================================  ==========  =================================

The class follows the body's code when there is one, else the status (a
proxy's error page, a refused Range). Errors that are not an answer of the
server:

* :class:`TransportError`: the server could not be reached or the
  connection broke (``status`` is None; the cause is chained).
* :class:`ResultNotReceived`: the call stopped before an execution's result
  (the wait's deadline passed, the stream broke); ``execution_id`` names the
  execution, whose result :meth:`Client.get_result` fetches later.
* :class:`SessionCreateFailed` and :class:`SessionNotReady`:
  :meth:`Client.ensure_session` could not create the session, or it did not
  become usable in time.
* :class:`WebhookVerificationError`: :func:`verify_webhook` refused a
  delivery.
"""

from __future__ import annotations

import email.utils
import json
import time
from http import HTTPStatus
from typing import Optional


class SbxError(Exception):
    """The base of every error of the sbx client.

    Attributes:
        status: the HTTP status, or None when the server did not answer.
        code: the API's error code (``not_found``, ``unavailable``, ...).
        message: what went wrong, as the server said it.
        retry_after: seconds the server asked to wait before trying again
            (429, 503), or None.
        execution_id: the execution the error is about, when there is one.
    """

    default_code = "internal"

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        retry_after: Optional[float] = None,
        execution_id: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or self.default_code
        self.message = message
        self.retry_after = retry_after
        self.execution_id = execution_id

    def __str__(self) -> str:
        status = self.status if self.status is not None else "-"
        return f"sbx: {status} {self.code}: {self.message}"


class InvalidArgument(SbxError):
    """400: the request is wrong (a bad id, a field the API does not know,
    an unsatisfiable Range, ...)."""

    default_code = "invalid_argument"


class Unauthenticated(SbxError):
    """401: no API key, or one the server does not know."""

    default_code = "unauthenticated"


class PermissionDenied(SbxError):
    """403: the key may not do this (a bad or expired presigned URL)."""

    default_code = "permission_denied"


class NotFound(SbxError):
    """404: the session, execution, file, snapshot or tool does not exist."""

    default_code = "not_found"


class Conflict(SbxError):
    """409: the thing exists already, or is not in a state that allows the
    call (a restore while executions run, too many files uploaded)."""

    default_code = "failed_precondition"


class PayloadTooLarge(SbxError):
    """413: an upload over the session's ``max_file_size``, or a body over
    the server's limit."""

    default_code = "payload_too_large"


class UnsupportedMediaType(SbxError):
    """415: an upload of a type the session's ``allowed_file_types`` refuses."""

    default_code = "unsupported_media_type"


class Unprocessable(SbxError):
    """422: more files in one upload than ``max_file_count``."""

    default_code = "unprocessable"


class ResourceExhausted(SbxError):
    """429: too many requests; retry after ``retry_after`` seconds."""

    default_code = "resource_exhausted"


class InternalError(SbxError):
    """500: the server failed; its log has the details."""

    default_code = "internal"


class Unavailable(SbxError):
    """503 (or 502, 504): the server cannot do it now, e.g. no sandbox can be
    had; the call may succeed when repeated after ``retry_after`` seconds."""

    default_code = "unavailable"


class TransportError(SbxError):
    """The server could not be reached, or the connection broke before its
    answer; ``__cause__`` is the underlying OSError or http.client error."""

    default_code = "transport"


class ResultNotReceived(SbxError):
    """The call ended without the execution's result: the wait's deadline
    passed, or the event stream broke. The execution may still run or be
    over; ``execution_id`` names it (None if the server never said it)."""

    default_code = "result_not_received"


class WebhookVerificationError(SbxError):
    """:func:`verify_webhook` did not take a delivery: no or a wrong
    signature, or a timestamp too old (a replay)."""

    default_code = "webhook_not_verified"


class SessionCreateFailed(SbxError):
    """:meth:`Client.ensure_session` could not create (or recreate) the
    session, or the session ended up in ``error`` or ``terminated``. When
    the create call failed, ``status``, ``code`` and ``retry_after`` are its
    error's and ``__cause__`` is that error."""

    default_code = "session_create_failed"

    def __init__(self, message: str, *, session_id: str, **kw) -> None:
        super().__init__(message, **kw)
        self.session_id = session_id


class SessionNotReady(SbxError):
    """:meth:`Client.ensure_session` polled the session for its number of
    tries and it was still not usable (``pending``)."""

    default_code = "session_not_ready"

    def __init__(self, message: str, *, session_id: str, **kw) -> None:
        super().__init__(message, **kw)
        self.session_id = session_id


_BY_CODE = {
    "invalid_argument": InvalidArgument,
    "unauthenticated": Unauthenticated,
    "permission_denied": PermissionDenied,
    "not_found": NotFound,
    "already_exists": Conflict,
    "failed_precondition": Conflict,
    "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "unprocessable": Unprocessable,
    "resource_exhausted": ResourceExhausted,
    "internal": InternalError,
    "unavailable": Unavailable,
}

_CODE_BY_STATUS = {
    400: "invalid_argument",
    405: "invalid_argument",
    416: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "failed_precondition",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "resource_exhausted",
    502: "unavailable",
    503: "unavailable",
    504: "unavailable",
}

_STATUS_BY_CODE = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "already_exists": 409,
    "failed_precondition": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "unprocessable": 422,
    "resource_exhausted": 429,
    "unavailable": 503,
}


def error_from_code(
    code: str,
    message: str,
    *,
    status: Optional[int] = None,
    retry_after: Optional[float] = None,
    execution_id: Optional[str] = None,
) -> SbxError:
    """Returns the exception for an API error code (an unknown code, from a
    later server, is a plain SbxError). status defaults to the code's."""
    if status is None:
        status = _STATUS_BY_CODE.get(code, 500)
    cls = _BY_CODE.get(code, SbxError)
    return cls(message, status=status, code=code, retry_after=retry_after, execution_id=execution_id)


def error_from_response(status: int, body: bytes, retry_after_header: Optional[str]) -> SbxError:
    """Returns the exception for an HTTP answer whose status is not the one
    wanted: from the API's error body when it has one, else from the status
    alone (with the start of the body as the message)."""
    retry = parse_retry_after(retry_after_header)
    try:
        doc = json.loads(body)
        err = doc["error"]
        code, message = err["code"], err.get("message", "")
        if isinstance(code, str) and code:
            return error_from_code(code, str(message), status=status, retry_after=retry)
    except (ValueError, KeyError, TypeError):
        pass
    code = _CODE_BY_STATUS.get(status, "internal")
    text = body[:4096].decode("utf-8", "replace").strip()
    if len(text) > 200:
        text = text[:200] + "..."
    if not text:
        try:
            text = HTTPStatus(status).phrase
        except ValueError:
            text = f"HTTP {status}"
    return _BY_CODE.get(code, SbxError)(text, status=status, code=code, retry_after=retry)


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Reads a Retry-After header: seconds, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())
