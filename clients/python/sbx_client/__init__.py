"""sbx_client: the Python client of the sbx sandbox server (standard library
only).

::

    from sbx_client import Client

    c = Client("http://127.0.0.1:7070")
    sid = c.ensure_session("alice", "analyst", create={"template_id": "python-datascience"})
    c.upload(sid, "data.csv", conversation_id="c1")
    x = c.execute(sid, "import pandas as pd\\nreturn len(pd.read_csv('/workspace/uploads/temparea/data.csv'))",
                  conversation_id="c1")
    print(x.status, x.return_value)

Results are dataclasses (:mod:`sbx_client.models`); failures raise
:class:`SbxError` subclasses (:mod:`sbx_client.errors`).
"""

from .client import Client
from .errors import (
    Conflict,
    InternalError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ResourceExhausted,
    ResultNotReceived,
    SbxError,
    SessionCreateFailed,
    SessionNotReady,
    TransportError,
    Unauthenticated,
    Unavailable,
    Unprocessable,
    UnsupportedMediaType,
    WebhookVerificationError,
)
from .models import (
    ChatEvent,
    Event,
    EventList,
    ExecError,
    Execution,
    ExecutionList,
    FileEntry,
    FileList,
    FileUploadConfig,
    Health,
    MetricsSample,
    NamedResource,
    Presign,
    ResourceList,
    Resources,
    ResourceSync,
    Session,
    SessionList,
    SessionMetrics,
    Snapshot,
    Template,
    TemplateBuild,
    TemplateVersion,
    Tool,
    ToolResult,
    UploadedFile,
    Webhook,
    WebhookDelivery,
    WebhookDeliveryList,
)
from ._agents import agent_session_id
from ._events import verify_webhook

__version__ = "0.1.0"

__all__ = [
    "Client",
    "agent_session_id",
    "verify_webhook",
    # errors
    "SbxError",
    "InvalidArgument",
    "Unauthenticated",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "Unprocessable",
    "ResourceExhausted",
    "InternalError",
    "Unavailable",
    "TransportError",
    "ResultNotReceived",
    "SessionCreateFailed",
    "SessionNotReady",
    "WebhookVerificationError",
    # results
    "Health",
    "Resources",
    "FileUploadConfig",
    "Session",
    "SessionList",
    "Snapshot",
    "Template",
    "TemplateBuild",
    "TemplateVersion",
    "SessionMetrics",
    "MetricsSample",
    "ExecError",
    "Execution",
    "ExecutionList",
    "UploadedFile",
    "FileEntry",
    "FileList",
    "Presign",
    "NamedResource",
    "ResourceSync",
    "ResourceList",
    "Tool",
    "ToolResult",
    "ChatEvent",
    "Event",
    "EventList",
    "Webhook",
    "WebhookDelivery",
    "WebhookDeliveryList",
]
