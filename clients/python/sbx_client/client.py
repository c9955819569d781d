"""The sbx client: one class, :class:`Client`, whose calls are grouped by
area in the mixins it is made of (sessions, executions, files, resources,
agents and tools, templates, events and webhooks). A new call goes into the mixin of its area, or a new mixin added to
Client's bases; each uses ``self._t`` (the :class:`Transport`) and returns
dataclasses of :mod:`sbx_client.models`."""

from __future__ import annotations

import ssl
from typing import Optional

from . import errors, models
from ._agents import AgentsMixin
from ._events import EventsMixin
from ._executions import ExecutionsMixin
from ._files import FilesMixin
from ._resources import ResourcesMixin
from ._sessions import SessionsMixin
from ._templates import TemplatesMixin
from ._transport import Transport


class Client(SessionsMixin, ExecutionsMixin, FilesMixin, ResourcesMixin, AgentsMixin, TemplatesMixin, EventsMixin):
    """A client of one sbx server; safe for concurrent use by threads.

    ::

        from sbx_client import Client

        c = Client("http://127.0.0.1:7070", api_key=None)
        sid = c.ensure_session("alice", "analyst")
        x = c.execute(sid, "return 6 * 7")
        print(x.status, x.return_value)

    Args:
        base_url: where the server is (the API lives under its /api/v1).
        api_key: sent as ``Authorization: Bearer KEY`` when set.
        timeout: seconds a request may wait for the server without hearing
            from it (a socket timeout, not a bound on the whole call). Calls
            that wait on purpose (a result's long poll, a tool's run, an
            event stream) allow for that on top.
        ssl_context: for https, instead of the default context.

    Connections are kept alive between calls; :meth:`close` (or ``with
    Client(...) as c:``) closes the idle ones.
    """

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str] = None,
        timeout: float = 60.0,
        *,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        self._t = Transport(base_url, api_key=api_key, timeout=timeout, ssl_context=ssl_context)

    @property
    def base_url(self) -> str:
        """The server's URL, without a trailing slash."""
        return self._t.base_url

    def close(self) -> None:
        """Closes idle connections; the client stays usable."""
        self._t.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def health(self) -> models.Health:
        """GET /healthz: whether the server process is up."""
        _, doc = self._t.call("GET", "/healthz")
        return models.from_dict(models.Health, doc)

    def readyz(self) -> models.Health:
        """GET /readyz: whether the server can take work. When it cannot,
        raises :class:`Unavailable`, whose message names the failing checks
        and whose ``health`` attribute is the answer."""
        status, doc = self._t.call("GET", "/readyz", ok=(200, 503))
        h = models.from_dict(models.Health, doc)
        if status != 200:
            bad = "; ".join(f"{k}: {v}" for k, v in sorted(h.checks.items()) if v != "ok")
            e = errors.Unavailable(f"not ready: {bad}", status=status)
            e.health = h  # type: ignore[attr-defined]
            raise e
        return h
