"""Sessions and snapshots (R-01..R-05, R-65)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Dict, List, Mapping, Optional, Union

from . import models
from ._transport import Transport, segment

P = "/api/v1"


def _session_path(session_id: str, rest: str = "") -> str:
    return f"{P}/sessions/{segment('session id', session_id)}{rest}"


def _drop_none(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class SessionsMixin:
    """Session calls of :class:`sbx_client.Client`."""

    _t: Transport

    def create_session(
        self,
        session_id: Optional[str] = None,
        *,
        template_id: Optional[str] = None,
        timeout: Optional[int] = None,
        idle_timeout: Optional[int] = None,
        hibernate_timeout: Optional[int] = None,
        warm_up: Optional[bool] = None,
        resources: Optional[Mapping[str, Any]] = None,
        env_vars: Optional[Mapping[str, str]] = None,
        network: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        file_upload_config: Optional[Mapping[str, Any]] = None,
    ) -> models.Session:
        """Creates a session, or returns the existing one of ``session_id``
        (creating is idempotent on the id; an existing session in a bad state
        is recovered).

        Args:
            session_id: the id (``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$``);
                None lets the server choose one.
            template_id: the template (the server's default: ``python``).
            timeout: time to live in seconds (default 86400, at most 604800).
            idle_timeout: seconds without activity before the sandbox is
                paused (default 600).
            hibernate_timeout: seconds without activity before the session
                is hibernated (default 86400).
            warm_up: start the sandbox now instead of at the first execution
                (the session is then ``pending`` until it runs).
            resources: ``{"cpu": cores, "memory": MiB, "disk": MiB}``.
            env_vars: environment of every execution.
            network: "none" (the default and only choice for now).
            metadata: e.g. ``{"user_id": ..., "agent_id": ...}``.
            file_upload_config: ``{"max_file_size", "max_file_size_unit"
                ("KB", "MB", "GB"), "max_file_count", "allowed_file_types"}``.
        """
        body = _drop_none(
            {
                "session_id": session_id,
                "template_id": template_id,
                "timeout": timeout,
                "idle_timeout": idle_timeout,
                "hibernate_timeout": hibernate_timeout,
                "warm_up": warm_up,
                "resources": dict(resources) if resources is not None else None,
                "env_vars": dict(env_vars) if env_vars is not None else None,
                "network": network,
                "metadata": dict(metadata) if metadata is not None else None,
                "file_upload_config": dict(file_upload_config) if file_upload_config is not None else None,
            }
        )
        _, doc = self._t.call("POST", f"{P}/sessions", body=body, ok=(200, 201))
        return models.from_dict(models.Session, doc)

    def get_session(self, session_id: str) -> models.Session:
        """Returns the session; raises :class:`NotFound` if there is none."""
        _, doc = self._t.call("GET", _session_path(session_id))
        return models.from_dict(models.Session, doc)

    def list_sessions(
        self,
        *,
        status: Optional[str] = None,
        user_id: Optional[str] = None,
        agent_id: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        limit: Optional[int] = None,
        page_token: Optional[str] = None,
    ) -> models.SessionList:
        """Returns a page of sessions, filtered (filters combine with AND):
        by status, by metadata ``user_id``/``agent_id``, and by each
        ``metadata`` key having its value. ``limit`` is the page size
        (1..1000, default 100); pass ``next_page_token`` of a page as
        ``page_token`` for the next."""
        meta = [f"{k}:{metadata[k]}" for k in sorted(metadata)] if metadata else None
        q = {
            "status": status,
            "user_id": user_id,
            "agent_id": agent_id,
            "metadata": meta,
            "limit": limit,
            "page_token": page_token or None,
        }
        _, doc = self._t.call("GET", f"{P}/sessions", query=q)
        return models.from_dict(models.SessionList, doc)

    def delete_session(self, session_id: str) -> None:
        """Terminates the session: its sandbox is killed and its workspace
        removed. Deleting a deleted session succeeds again."""
        self._t.call("DELETE", _session_path(session_id))

    def pause_session(self, session_id: str) -> models.Session:
        """Freezes the session's sandbox (memory kept, no CPU). Any execute
        or file call resumes it."""
        return self._session_call("POST", session_id, "/pause")

    def resume_session(self, session_id: str) -> models.Session:
        """Resumes a paused or hibernated session and warms its sandbox."""
        return self._session_call("POST", session_id, "/resume")

    def keepalive_session(self, session_id: str, timeout: Optional[int] = None) -> models.Session:
        """Makes the session expire ``timeout`` seconds from now (None: its
        TTL from now)."""
        body = {"timeout": timeout} if timeout else None
        return self._session_call("POST", session_id, "/keepalive", body)

    def hibernate_session(self, session_id: str) -> models.Session:
        """Saves the session's workspace to the blob store and destroys its
        sandbox; the next call restores it."""
        return self._session_call("POST", session_id, "/hibernate")

    def _session_call(self, method: str, session_id: str, rest: str, body: Any = None) -> models.Session:
        _, doc = self._t.call(method, _session_path(session_id, rest), body=body)
        return models.from_dict(models.Session, doc)

    def session_metrics(self, session_id: str, since: Union[datetime, str, None] = None) -> models.SessionMetrics:
        """The usage of the session's sandbox (R-86): CPU, memory, disk and
        processes, in a reading taken now and in the samples the server
        took, oldest first; only those at or after ``since`` (a datetime,
        naive ones taken as UTC, or an RFC 3339 string) when given. A session
        without a running or paused sandbox has no readings, and
        ``sandbox`` says what it has."""
        if isinstance(since, datetime):
            if since.tzinfo is None:
                since = since.replace(tzinfo=timezone.utc)
            since = since.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        _, doc = self._t.call("GET", _session_path(session_id, "/metrics"), query={"since": since})
        return models.from_dict(models.SessionMetrics, doc)

    # Snapshots.

    def create_snapshot(self, session_id: str) -> models.Snapshot:
        """Snapshots the session's workspace (incremental: ``new_bytes`` is
        what this one added to the blob store)."""
        _, doc = self._t.call("POST", _session_path(session_id, "/snapshots"), ok=(201,))
        return models.from_dict(models.Snapshot, doc)

    def list_snapshots(self, session_id: str) -> List[models.Snapshot]:
        """Returns the session's snapshots, oldest first."""
        _, doc = self._t.call("GET", _session_path(session_id, "/snapshots"))
        return [models.from_dict(models.Snapshot, s) for s in (doc or {}).get("snapshots") or []]

    def get_snapshot(self, session_id: str, snapshot_id: str) -> models.Snapshot:
        """Describes one snapshot."""
        _, doc = self._t.call("GET", _snapshot_path(session_id, snapshot_id))
        return models.from_dict(models.Snapshot, doc)

    def delete_snapshot(self, session_id: str, snapshot_id: str) -> None:
        """Deletes one snapshot."""
        self._t.call("DELETE", _snapshot_path(session_id, snapshot_id), ok=(204,))

    def restore_snapshot(self, session_id: str, snapshot_id: str) -> models.Session:
        """Replaces the session's workspace with the snapshot's (the sandbox
        is destroyed; the next execution gets a new one). :class:`Conflict`
        while executions or file calls are in flight."""
        _, doc = self._t.call("POST", _snapshot_path(session_id, snapshot_id, "/restore"))
        return models.from_dict(models.Session, doc)


def _snapshot_path(session_id: str, snapshot_id: str, rest: str = "") -> str:
    return _session_path(session_id, f"/snapshots/{segment('snapshot id', snapshot_id)}{rest}")
