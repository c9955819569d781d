"""Resources (R-34): named read-only files a session's sandbox always has
(skills, commands), kept in step with a manifest so that only what changed
goes over the wire."""

from __future__ import annotations

import hashlib
from typing import Dict, Mapping, Union

from . import errors, models
from ._sessions import P, _session_path
from ._transport import Transport

# A sync sends the manifest, the content the server lacks, and the manifest
# again; content can go missing in between (collected, or another sync), so
# it tries a few rounds before it gives up.
_ROUNDS = 3


class ResourcesMixin:
    """Resource calls of :class:`sbx_client.Client`."""

    _t: Transport

    def sync_resources(self, session_id: str, resources: Mapping[str, Union[bytes, str]]) -> models.ResourceSync:
        """Makes the session's resources exactly ``resources``, names (like
        ``skills/pdf/SKILL.md``) to contents (str is UTF-8). Only content the
        server does not have is uploaded, resources not named are removed,
        and an unchanged set costs one small request. Content is stored
        once per tenant, however many sessions hold it. The sandbox sees the
        resources read-only under the answer's ``path``
        (``/workspace/.resources/NAME``).

        Raises :class:`InvalidArgument` for a bad manifest (a name with
        ``..``, a name that is also a directory, more than 1000 entries).
        """
        contents: Dict[str, bytes] = {}
        manifest = []
        for name in sorted(resources):
            data = resources[name]
            if isinstance(data, str):
                data = data.encode("utf-8")
            elif not isinstance(data, (bytes, bytearray)):
                raise TypeError(f"resource {name!r}: want bytes or str, not {type(data).__name__}")
            sha = hashlib.sha256(data).hexdigest()
            contents[sha] = bytes(data)
            manifest.append({"name": name, "sha256": sha, "size": len(data)})
        path = _session_path(session_id, "/resources")
        requests, uploaded = 0, []
        first = None
        for _ in range(_ROUNDS):
            _, doc = self._t.call("PUT", path, body={"resources": manifest})
            requests += 1
            doc = doc or {}
            if first is None:
                first = doc
            if doc.get("complete"):
                break
            sent = set()
            for n in doc.get("needed") or []:
                sha = n.get("sha256", "")
                if sha in sent:
                    continue
                sent.add(sha)
                self._put_content(contents[sha])
                requests += 1
                uploaded.append(n.get("name", ""))
        else:
            raise errors.SbxError(
                f"resources of session {session_id}: the server still needs "
                f"{len(doc.get('needed') or [])} after {_ROUNDS} rounds",
                code="incomplete",
            )
        out = models.from_dict(models.ResourceSync, doc)
        # The whole sync: what the first answer did, and what later ones
        # added when the content came.
        if first is not doc:
            out.added = list(first.get("added") or []) + out.added
            out.changed = list(first.get("changed") or []) + out.changed
            out.removed = list(first.get("removed") or []) + out.removed
            out.unchanged = first.get("unchanged") or 0
        out.uploaded, out.requests = uploaded, requests
        return out

    def list_resources(self, session_id: str) -> models.ResourceList:
        """Returns the session's resources in place."""
        _, doc = self._t.call("GET", _session_path(session_id, "/resources"))
        return models.from_dict(models.ResourceList, doc)

    def _put_content(self, data: bytes) -> None:
        sha = hashlib.sha256(data).hexdigest()
        self._t.request(
            "PUT",
            f"{P}/resources/{sha}",
            body=data,
            headers={"Content-Type": "application/octet-stream"},
            ok=(200, 201),
        ).read()
