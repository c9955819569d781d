"""The results of the sbx client: plain dataclasses.

Every result is a dataclass whose fields are the JSON fields of the API
(api/openapi.yaml) under the same names, with times as timezone-aware
:class:`datetime.datetime` (UTC) and nested objects as dataclasses too. A
field the server left out has its default (None, 0, "" or empty). Each
dataclass also keeps the JSON object it was made from in ``raw`` (left out of
repr and comparisons), so a field that a later server adds is reachable
before this package knows it.

Requests take keyword arguments, not dataclasses.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional, Type, TypeVar

T = TypeVar("T")

# Session statuses.
PENDING = "pending"
RUNNING = "running"
PAUSED = "paused"
HIBERNATED = "hibernated"
ERROR = "error"
TERMINATED = "terminated"

# Execution statuses: submitted, pending and running, then one of the
# final four.
EXEC_SUBMITTED = "submitted"
EXEC_PENDING = "pending"
EXEC_RUNNING = "running"
EXEC_COMPLETED = "completed"
EXEC_FAILED = "failed"
EXEC_TIMEOUT = "timeout"
EXEC_CANCELLED = "cancelled"
FINAL_STATUSES = frozenset({EXEC_COMPLETED, EXEC_FAILED, EXEC_TIMEOUT, EXEC_CANCELLED})

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


def parse_time(value: Any) -> Optional[datetime]:
    """Parses an RFC 3339 time as the server writes it (nanoseconds are cut
    to microseconds). None, "" and a value that is not one give None."""
    if not isinstance(value, str):
        return None
    m = _RFC3339.match(value)
    if not m:
        return None
    y, mo, d, h, mi, s, frac, z, sign, oh, om = m.groups()
    tz = timezone.utc
    if not z:
        off = timedelta(hours=int(oh), minutes=int(om))
        tz = timezone(-off if sign == "-" else off)
    micro = int((frac or "0")[:6].ljust(6, "0"))
    try:
        return datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), micro, tzinfo=tz).astimezone(timezone.utc)
    except ValueError:
        return None


def _time(default=None):
    return field(default=default, metadata={"conv": parse_time})


def _nested(cls, default=None):
    return field(default=default, metadata={"conv": lambda v: from_dict(cls, v) if isinstance(v, dict) else None})


def _nested_list(cls):
    return field(
        default_factory=list,
        metadata={"conv": lambda v: [from_dict(cls, x) for x in v] if isinstance(v, list) else []},
    )


def _raw():
    return field(default_factory=dict, repr=False, compare=False)


def from_dict(cls: Type[T], data: Optional[Dict[str, Any]]) -> T:
    """Makes a result dataclass from its JSON object: known fields are
    converted, unknown ones stay in ``raw``, missing ones keep their
    defaults."""
    data = data if isinstance(data, dict) else {}
    kw = {}
    for f in fields(cls):
        if f.name == "raw" or f.name not in data:
            continue
        v = data[f.name]
        conv = f.metadata.get("conv")
        if conv is not None:
            v = conv(v)
        elif v is None:  # null where the API promises a value: keep the default
            if f.default_factory is not MISSING:
                v = f.default_factory()
            elif f.default is not MISSING:
                v = f.default
        kw[f.name] = v
    return cls(raw=data, **kw)


@dataclass
class Health:
    """The answer of /healthz and /readyz: ``status`` is "ok" or
    "unavailable"; ``checks`` maps each dependency to "ok" or what is wrong."""

    status: str = ""
    checks: Dict[str, str] = field(default_factory=dict)
    raw: Dict[str, Any] = _raw()


@dataclass
class Resources:
    """A session's sandbox limits: ``cpu`` in cores, ``memory`` and ``disk``
    in MiB (0: the template's default)."""

    cpu: float = 0
    memory: int = 0
    disk: int = 0
    raw: Dict[str, Any] = _raw()


@dataclass
class FileUploadConfig:
    """What may be uploaded into a session (R-20)."""

    max_file_size: int = 0
    max_file_size_unit: str = ""
    max_file_count: int = 0
    allowed_file_types: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = _raw()


@dataclass
class Session:
    """A session (R-02). ``status`` is one of pending, running, paused,
    hibernated, error, terminated; ``error`` says why it is in error;
    ``sandbox_state`` is none, starting, running or paused."""

    session_id: str = ""
    status: str = ""
    template_id: str = ""
    error: str = ""
    created_at: Optional[datetime] = _time()
    last_activity_at: Optional[datetime] = _time()
    expires_at: Optional[datetime] = _time()
    ttl: int = 0
    idle_timeout: int = 0
    hibernate_timeout: int = 0
    sandbox_state: str = ""
    resources: Optional[Resources] = _nested(Resources)
    network: str = ""
    metadata: Dict[str, str] = field(default_factory=dict)
    file_upload_config: Optional[FileUploadConfig] = _nested(FileUploadConfig)
    env_vars: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = _raw()


@dataclass
class SessionList:
    """A page of sessions; pass ``next_page_token`` as ``page_token`` for the
    next page ("" on the last)."""

    sessions: List[Session] = _nested_list(Session)
    next_page_token: str = ""
    raw: Dict[str, Any] = _raw()


@dataclass
class Snapshot:
    """A saved copy of a session's workspace (R-65). ``new_bytes``, in the
    answer to a create, is what the snapshot added to the blob store."""

    snapshot_id: str = ""
    session_id: str = ""
    created_at: Optional[datetime] = _time()
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    new_bytes: Optional[int] = None
    raw: Dict[str, Any] = _raw()


@dataclass
class MetricsSample:
    """One reading of a session's sandbox (R-86). ``cpu_used_pct`` is the
    CPU used since the reading before, as a percentage of what its
    ``cpu_count`` cores allow; ``memory_used_bytes`` is what its memory limit
    counts, page cache (``memory_cache_bytes``) included;
    ``disk_used_bytes`` and ``disk_limit_bytes`` are its workspace's as the
    disk quota counts them (0 when the server has no disk quotas)."""

    timestamp: Optional[datetime] = _time()
    cpu_used_pct: float = 0.0
    cpu_count: float = 0.0
    memory_used_bytes: int = 0
    memory_cache_bytes: int = 0
    memory_limit_bytes: int = 0
    disk_used_bytes: int = 0
    disk_limit_bytes: int = 0
    pids: int = 0
    pids_limit: int = 0
    raw: Dict[str, Any] = _raw()


@dataclass
class SessionMetrics:
    """The usage of a session's sandbox (R-86): ``current`` is a reading
    taken for the call (None without a running or paused sandbox),
    ``samples`` the server's readings every ``interval_seconds``, oldest
    first; ``sandbox`` is none, starting, running, paused or hibernated."""

    session_id: str = ""
    sandbox: str = ""
    interval_seconds: float = 0.0
    current: Optional[MetricsSample] = _nested(MetricsSample)
    samples: List[MetricsSample] = _nested_list(MetricsSample)
    raw: Dict[str, Any] = _raw()


@dataclass
class ExecError:
    """Why an execution did not complete: ``type`` is the exception's name
    (ZeroDivisionError), Timeout, NonZeroExit, SandboxUnavailable, ..."""

    type: str = ""
    message: str = ""
    traceback: str = ""
    raw: Dict[str, Any] = _raw()


@dataclass
class Execution:
    """An execution and, once it is over, its result (R-11).

    ``status`` is submitted, pending, running, then completed, failed,
    timeout or cancelled. ``return_value`` is the JSON value the code
    returned (None if it returned nothing). ``artifacts`` are the workspace
    paths the run created or modified. get_execution and list_executions
    leave out the output and result fields.
    """

    execution_id: str = ""
    session_id: str = ""
    status: str = ""
    language: str = ""
    conversation_id: str = ""
    context_id: str = ""
    created_at: Optional[datetime] = _time()
    started_at: Optional[datetime] = _time()
    finished_at: Optional[datetime] = _time()
    duration_ms: int = 0
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit_code: Optional[int] = None
    return_value: Any = None
    error: Optional[ExecError] = _nested(ExecError)
    artifacts: List[str] = field(default_factory=list)
    #: In a result read back from the server's record: the fields it keeps
    #: only in part (or, for return_value, not at all), with their full
    #: sizes in bytes. Empty for the answer of the request that ran it.
    truncated: Dict[str, int] = field(default_factory=dict)
    raw: Dict[str, Any] = _raw()

    @property
    def done(self) -> bool:
        """Whether the execution is over (completed, failed, timeout or
        cancelled)."""
        return self.status in FINAL_STATUSES

    @property
    def ok(self) -> bool:
        """Whether the execution completed."""
        return self.status == EXEC_COMPLETED


@dataclass
class ExecutionList:
    """A page of a session's executions, newest first, without outputs."""

    executions: List[Execution] = _nested_list(Execution)
    next_page_token: str = ""
    raw: Dict[str, Any] = _raw()


@dataclass
class UploadedFile:
    """One uploaded file: ``path`` is its workspace-relative path (the name
    for the other file calls), ``sandbox_path`` where the session's code (for
    a conversation upload: that conversation's code) sees it."""

    name: str = ""
    path: str = ""
    sandbox_path: str = ""
    size: int = 0
    sha256: str = ""
    conversation_id: str = ""
    raw: Dict[str, Any] = _raw()


@dataclass
class FileEntry:
    """One entry of a listing; ``type`` is file, dir, symlink or other."""

    name: str = ""
    path: str = ""
    type: str = ""
    size: int = 0
    modified_at: Optional[datetime] = _time()
    raw: Dict[str, Any] = _raw()


@dataclass
class FileList:
    """A listing; ``truncated`` says there were more entries than shown."""

    files: List[FileEntry] = _nested_list(FileEntry)
    truncated: bool = False
    raw: Dict[str, Any] = _raw()


@dataclass
class Presign:
    """A URL that downloads a file without an API key until ``expires_at``."""

    url: str = ""
    expires_at: Optional[datetime] = _time()
    raw: Dict[str, Any] = _raw()


@dataclass
class Tool:
    """A tool definition for LLM function calling (R-32). ``raw`` is the
    definition in the OpenAI function-calling shape
    (``{"type": "function", "function": {...}}``): pass ``[t.raw for t in
    tools]`` to a chat-completions call as it is. ``parameters`` is the JSON
    Schema of the tool's arguments."""

    type: str = ""
    name: str = ""
    description: str = ""
    parameters: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = _raw()

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Tool":
        fn = data.get("function") or {}
        return cls(
            type=data.get("type", ""),
            name=fn.get("name", ""),
            description=fn.get("description", ""),
            parameters=fn.get("parameters") or {},
            raw=data,
        )


@dataclass
class ToolResult:
    """What a tool call gives back: ``content`` is the text to show the
    model, ``is_error`` says the call ran and failed (the model should see
    why), ``data`` is the structured result (an execution's JSON, a file
    listing, read_file's ``{content, next_offset, eof, ...}``)."""

    content: str = ""
    is_error: bool = False
    session_id: str = ""
    data: Any = None
    raw: Dict[str, Any] = _raw()


@dataclass
class ChatEvent:
    """One event of a chat turn (R-33): ``name`` is ``delta`` (``data``
    has ``text``), ``tool_call`` (``id``, ``name``, ``arguments``),
    ``tool_result`` (``id``, ``name``, ``content``, ``is_error``),
    ``message`` (``role``, ``content``), ``error`` (``code``, ``message``)
    or ``done`` (``session_id``, ``conversation_id``, ``steps``, ``usage``),
    always the last; ``data`` is its JSON object."""

    name: str
    data: Dict[str, Any]


@dataclass
class NamedResource:
    """One resource of a manifest (R-34): its name under the resources
    directory, and its content's SHA-256 (lowercase hex) and size."""

    name: str = ""
    sha256: str = ""
    size: int = 0
    raw: Dict[str, Any] = _raw()


@dataclass
class ResourceSync:
    """What :meth:`Client.sync_resources` did. ``path`` is where the sandbox
    sees the resources (``/workspace/.resources``); ``complete`` that all of
    the manifest is in place; ``needed`` what the server still lacks (empty
    when complete); ``added``, ``changed``, ``removed`` name what changed and
    ``unchanged`` counts the rest. ``uploaded`` names the resources whose
    content went over the wire, ``requests`` counts the HTTP requests the
    sync took (1 when nothing changed). ``raw`` is the server's last
    answer."""

    path: str = ""
    complete: bool = False
    needed: List[NamedResource] = _nested_list(NamedResource)
    added: List[str] = field(default_factory=list)
    changed: List[str] = field(default_factory=list)
    removed: List[str] = field(default_factory=list)
    unchanged: int = 0
    uploaded: List[str] = field(default_factory=list)
    requests: int = 0
    raw: Dict[str, Any] = _raw()


@dataclass
class ResourceList:
    """A session's resources in place, and where the sandbox sees them."""

    path: str = ""
    resources: List[NamedResource] = _nested_list(NamedResource)
    raw: Dict[str, Any] = _raw()


@dataclass
class TemplateBuild:
    """A build of one of the caller's templates: ``status`` is queued,
    building, ready, failed or cancelled."""

    build_id: str = ""
    hash: str = ""
    status: str = ""
    error: str = ""
    queued_at: Optional[datetime] = _time()
    started_at: Optional[datetime] = _time()
    finished_at: Optional[datetime] = _time()
    raw: Dict[str, Any] = _raw()


@dataclass
class TemplateVersion:
    """A version of one of the caller's templates that was built."""

    hash: str = ""
    build_id: str = ""
    size_bytes: int = 0
    built_at: Optional[datetime] = _time()
    raw: Dict[str, Any] = _raw()


@dataclass
class Template:
    """A template (R-40): ``source`` is builtin, operator or tenant (the
    caller's own); ``status`` is ready, not_built, queued, building, failed
    or cancelled; ``hash`` is the version, which a session keeps."""

    name: str = ""
    source: str = ""
    status: str = ""
    hash: str = ""
    runtime: str = ""
    release: str = ""
    size_bytes: int = 0
    built_at: Optional[datetime] = _time()
    last_error: str = ""
    build: Optional[TemplateBuild] = _nested(TemplateBuild)
    versions: List[TemplateVersion] = _nested_list(TemplateVersion)
    raw: Dict[str, Any] = _raw()


@dataclass
class Event:
    """A lifecycle event (R-87): ``id`` numbers the tenant's events 1, 2,
    3... in the order they were recorded; ``type`` is session.created,
    session.paused, execution.finished, ... (api/openapi.yaml, EventType);
    ``data`` is what it says besides its type
    (``status``, ``template_id``, ``sandbox_id``, ``reason``,
    ``execution_id``, ``duration_ms``, ``exit_code``, ...), as a dict."""

    id: int = 0
    type: str = ""
    session_id: str = ""
    created_at: Optional[datetime] = _time()
    data: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = _raw()


@dataclass
class EventList:
    """A page of events, oldest first; pass ``next_after`` as ``after`` for
    the next page."""

    events: List[Event] = _nested_list(Event)
    next_after: int = 0
    raw: Dict[str, Any] = _raw()


@dataclass
class Webhook:
    """A registered webhook; ``secret`` only in the answer to its
    creation."""

    webhook_id: str = ""
    url: str = ""
    events: List[str] = field(default_factory=list)
    created_at: Optional[datetime] = _time()
    secret: str = ""
    raw: Dict[str, Any] = _raw()


@dataclass
class WebhookDelivery:
    """One attempt to deliver an event to a webhook: ``ok`` for a 2xx,
    ``final`` on the event's last attempt (delivered or given up)."""

    delivery_id: str = ""
    event_id: int = 0
    event_type: str = ""
    attempt: int = 0
    at: Optional[datetime] = _time()
    ok: bool = False
    status_code: int = 0
    error: str = ""
    duration_ms: int = 0
    final: bool = False
    raw: Dict[str, Any] = _raw()


@dataclass
class WebhookDeliveryList:
    """A webhook's latest attempts, newest first; ``after`` is the last
    event it is done with."""

    deliveries: List[WebhookDelivery] = _nested_list(WebhookDelivery)
    after: int = 0
    raw: Dict[str, Any] = _raw()
