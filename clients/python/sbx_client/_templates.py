"""Templates over the API (R-40): the built-ins, the server operator's and
the caller's own, and the builds of the caller's own."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Tuple

from . import errors, models
from ._executions import STREAM_MIN_TIMEOUT
from ._transport import Transport, segment
from .sse import json_events

P = "/api/v1"


def _template_path(name: str, rest: str = "") -> str:
    return f"{P}/templates/{segment('template name', name)}{rest}"


class TemplatesMixin:
    _t: Transport

    def list_templates(self) -> List[models.Template]:
        """The templates a session can use, by name."""
        _, doc = self._t.call("GET", f"{P}/templates")
        return [models.from_dict(models.Template, t) for t in (doc or {}).get("templates") or []]

    def get_template(self, name: str) -> models.Template:
        """One template; the caller's own come with their latest build and
        their versions."""
        _, doc = self._t.call("GET", _template_path(name))
        return models.from_dict(models.Template, doc)

    def create_template(self, spec: Mapping[str, Any]) -> Tuple[models.Template, bool]:
        """Defines one of the caller's templates by ``spec`` (the JSON of
        ``sbx template build --file``) and builds it in the background.
        Returns the template and whether a build was queued; when not, the
        spec was built already and the template is ready. Sessions keep the
        version they started on."""
        status, doc = self._t.call("POST", f"{P}/templates", body=dict(spec), ok=(200, 202))
        return models.from_dict(models.Template, doc), status == 202

    def delete_template(self, name: str, force: bool = False) -> None:
        """Deletes one of the caller's templates; refused (Conflict) while
        sessions use it unless ``force``."""
        self._t.call("DELETE", _template_path(name), query={"force": "true" if force else None}, ok=(204,))

    def cancel_template_build(self, name: str, build_id: str) -> models.Template:
        """Cancels a build that is queued or running; it leaves nothing behind."""
        _, doc = self._t.call("POST", _template_path(name, f"/builds/{segment('build id', build_id)}/cancel"), ok=(202,))
        return models.from_dict(models.Template, doc)

    def follow_template_build(
        self, name: str, build_id: str, on_log: Optional[Callable[[str], None]] = None
    ) -> models.Template:
        """Streams a build's log to ``on_log`` a line at a time until the
        build ends, and returns the template as it ended (its ``status``
        ready, failed or cancelled)."""
        resp = self._t.request(
            "GET",
            _template_path(name, f"/builds/{segment('build id', build_id)}/logs"),
            headers={"Accept": "text/event-stream"},
            timeout=max(self._t.timeout, STREAM_MIN_TIMEOUT),
        )
        with resp:
            for event, data in json_events(resp, f"template {name}"):
                if event == "log" and on_log is not None:
                    on_log(data.get("text", ""))
                elif event == "end":
                    return models.from_dict(models.Template, data)
        raise errors.TransportError(f"template {name}: build {build_id}: the stream ended before the build")
