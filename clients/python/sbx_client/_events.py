"""Lifecycle events (R-87): the tenant's events as pages or as a stream
that follows them, and webhooks, with the receiver's check of a delivery's
signature (:func:`verify_webhook`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

from . import errors, models
from ._sessions import P, _session_path
from ._transport import Transport, segment
from .sse import SSEParser

# The server sends a keep-alive comment every 15 s on a quiet stream.
_STREAM_TIMEOUT = 45.0
# A broken stream is opened again after this, doubling while it keeps
# breaking before an event comes.
_RECONNECT_MIN = 0.25
_RECONNECT_MAX = 5.0

# How old (or how far ahead) a delivery's timestamp may be.
DEFAULT_WEBHOOK_TOLERANCE = 300.0


def _events_query(after: int, types: Optional[Sequence[str]], session_id: Optional[str], limit: Optional[int]) -> Dict[str, Any]:
    return {
        "after": after or None,
        "types": ",".join(types) if types else None,
        "session_id": session_id or None,
        "limit": limit,
    }


class EventsMixin:
    """Event and webhook calls of :class:`sbx_client.Client`."""

    _t: Transport

    def list_events(
        self,
        after: int = 0,
        *,
        types: Optional[Sequence[str]] = None,
        session_id: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> models.EventList:
        """Returns a page of the tenant's events after ``after``, oldest
        first: all, of ``types`` (event types or groups such as
        ``session.*``) and of ``session_id`` if given (``limit`` 1..1000,
        default 100)."""
        _, doc = self._t.call("GET", P + "/events", query=_events_query(after, types, session_id, limit))
        return models.from_dict(models.EventList, doc)

    def session_events(self, session_id: str, after: int = 0, *, limit: Optional[int] = None) -> models.EventList:
        """Returns a page of one of the tenant's sessions' events; raises
        :class:`NotFound` for a session it does not have."""
        _, doc = self._t.call("GET", _session_path(session_id, "/events"), query=_events_query(after, None, None, limit))
        return models.from_dict(models.EventList, doc)

    def events(
        self,
        after: int = 0,
        *,
        types: Optional[Sequence[str]] = None,
        session_id: Optional[str] = None,
    ) -> Iterator[models.Event]:
        """Yields the tenant's events after ``after`` as they happen, for
        ever: a server-sent event stream that is opened again, from the last
        event read, when its connection breaks (or the server is briefly
        unavailable). Stop by leaving the loop::

            for ev in c.events(types=["session.*"]):
                print(ev.id, ev.type, ev.session_id)

        An error the server answers a (re)connection with, but 429 and 503,
        is raised.
        """
        q = _events_query(0, types, session_id, None)
        wait = _RECONNECT_MIN
        while True:
            try:
                resp = self._t.request(
                    "GET",
                    P + "/events",
                    query=q,
                    headers={"Accept": "text/event-stream", "Last-Event-ID": str(after)},
                    timeout=max(self._t.timeout, _STREAM_TIMEOUT),
                )
            except (errors.Unavailable, errors.ResourceExhausted, errors.TransportError):
                time.sleep(wait)
                wait = min(wait * 2, _RECONNECT_MAX)
                continue
            parser = SSEParser()
            with resp:
                try:
                    for chunk in resp.chunks():
                        for ev in parser.feed(chunk):
                            try:
                                doc = json.loads(ev.data)
                            except ValueError as e:
                                raise errors.SbxError(f"events: event {ev.name} (id {ev.id}): {e}") from e
                            after = max(after, _int(ev.id))
                            wait = _RECONNECT_MIN
                            yield models.from_dict(models.Event, doc)
                        after = max(after, _int(parser.last_id))  # an id line alone moves it on
                except errors.TransportError:
                    pass
            time.sleep(wait)
            wait = min(wait * 2, _RECONNECT_MAX)

    def create_webhook(
        self, url: str, *, events: Optional[Sequence[str]] = None, secret: Optional[str] = None
    ) -> models.Webhook:
        """Registers a webhook: the tenant's events of ``events`` (all when
        None) are POSTed to ``url``, signed with ``secret`` (made by the
        server when None). The answer's ``secret`` is never shown again."""
        body: Dict[str, Any] = {"url": url}
        if events is not None:
            body["events"] = list(events)
        if secret is not None:
            body["secret"] = secret
        _, doc = self._t.call("POST", P + "/webhooks", body=body, ok=(201,))
        return models.from_dict(models.Webhook, doc)

    def list_webhooks(self) -> list:
        """Returns the tenant's webhooks, without their secrets."""
        _, doc = self._t.call("GET", P + "/webhooks")
        return [models.from_dict(models.Webhook, w) for w in (doc or {}).get("webhooks") or []]

    def get_webhook(self, webhook_id: str) -> models.Webhook:
        """Returns one webhook, without its secret."""
        _, doc = self._t.call("GET", P + "/webhooks/" + segment("webhook_id", webhook_id))
        return models.from_dict(models.Webhook, doc)

    def delete_webhook(self, webhook_id: str) -> None:
        """Deletes a webhook."""
        self._t.call("DELETE", P + "/webhooks/" + segment("webhook_id", webhook_id), ok=(204,))

    def webhook_deliveries(self, webhook_id: str) -> models.WebhookDeliveryList:
        """Returns a webhook's delivery log: its latest attempts, newest
        first."""
        _, doc = self._t.call("GET", P + "/webhooks/" + segment("webhook_id", webhook_id) + "/deliveries")
        return models.from_dict(models.WebhookDeliveryList, doc)


def _int(v: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def verify_webhook(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    tolerance: float = DEFAULT_WEBHOOK_TOLERANCE,
    now: Optional[float] = None,
) -> None:
    """Checks a delivery a webhook received, or raises
    :class:`WebhookVerificationError`: ``X-Sbx-Signature`` must be
    ``sha256=`` and the hex HMAC-SHA256 under ``secret`` of
    ``X-Sbx-Timestamp``, ``.``, and the body as received (the raw bytes),
    and the timestamp within ``tolerance`` seconds of now, so that a
    delivery seen on the way cannot be sent again later. Take each
    ``X-Sbx-Delivery`` once: an event is sent again when its answer was
    lost. ``headers`` is any mapping (names are matched without regard to
    case)."""
    h = {k.lower(): v for k, v in headers.items()}
    ts = h.get("x-sbx-timestamp", "")
    try:
        sec = int(ts)
    except ValueError:
        raise errors.WebhookVerificationError(f"X-Sbx-Timestamp {ts!r} is not a unix time") from None
    if abs((time.time() if now is None else now) - sec) > tolerance:
        raise errors.WebhookVerificationError(f"the delivery's timestamp is more than {tolerance:.0f} s away from now")
    sig = h.get("x-sbx-signature", "")
    if not sig.startswith("sha256="):
        raise errors.WebhookVerificationError("no sha256= signature in X-Sbx-Signature")
    want = hmac.new(secret.encode("utf-8"), ts.encode("ascii") + b"." + bytes(body), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(sig[len("sha256=") :], want):
        raise errors.WebhookVerificationError("the signature does not match")
