"""Calls that name an agent and a user (R-30, R-31), the LLM tools (R-32)
and the chat loop (R-33)."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Mapping, Optional

from . import errors, models
from ._executions import STREAM_MIN_TIMEOUT, execution_body
from ._files import _agent_path
from ._transport import Transport, segment
from .sse import json_events

P = "/api/v1"

# invoke_tool waits for the run of execute_code and run_bash in one
# request; without a timeout in the arguments, allow this long for it.
TOOL_RUN_ALLOWANCE = 300.0


def agent_session_id(user_id: str, agent_id: str) -> str:
    """The session of a user's agent (R-31): ``sb-session-{user_id}-{agent_id}``
    with every ``-`` in the user id doubled, so that no two (user, agent)
    pairs share a session (``alice``/``data-analyst`` and
    ``alice-data``/``analyst`` would otherwise)."""
    return "sb-session-%s-%s" % (user_id.replace("-", "--"), agent_id)


class AgentsMixin:
    """Agent and tool calls of :class:`sbx_client.Client`."""

    _t: Transport

    def ensure_session(
        self,
        user_id: str,
        agent_id: str,
        tries: int = 30,
        interval: float = 0.5,
        create: Optional[Mapping[str, Any]] = None,
    ) -> str:
        """Returns the id of the session of a user's agent,
        ``sb-session-{user_id}-{agent_id}``, ready for calls (R-31).

        The algorithm (the Go client's ``EnsureSession``):

        1. GET the session.
        2. 404: create it. ``terminated``: create it anew. ``error``:
           recreate it (creating an id in error recovers it: a new sandbox
           over the same workspace). Any other error of the GET is raised.
        3. ``running``, ``paused`` or ``hibernated``: return the id (a call
           on a paused or hibernated session resumes it).
        4. ``pending``: GET again every ``interval`` seconds, up to ``tries``
           looks at the session in all (the first GET's or the create's
           answer included); still not usable: :class:`SessionNotReady`.

        A failed create (or a session that ends up in ``error`` or
        ``terminated`` while polled) raises :class:`SessionCreateFailed`,
        chaining the cause.

        Args:
            tries: how many times to look at the session (default 30).
            interval: seconds between looks (default 0.5).
            create: keyword arguments of :meth:`create_session` used when the
                session must be created (``{"template_id":
                "python-datascience"}``, say); ``user_id`` and ``agent_id``
                are added to its metadata.
        """
        tries = tries if tries and tries > 0 else 30
        interval = interval if interval and interval > 0 else 0.5
        if not user_id or not agent_id:
            raise errors.SessionCreateFailed(
                "sbx: user id and agent id are required", session_id=agent_session_id(user_id, agent_id)
            )
        sid = agent_session_id(user_id, agent_id)

        def make() -> models.Session:
            kw = dict(create or {})
            kw.pop("session_id", None)
            meta = dict(kw.pop("metadata", None) or {})
            meta["user_id"], meta["agent_id"] = user_id, agent_id
            try:
                return self.create_session(sid, metadata=meta, **kw)  # type: ignore[attr-defined]
            except errors.SbxError as e:
                raise errors.SessionCreateFailed(
                    f"session {sid}: create failed: {e}",
                    session_id=sid,
                    status=e.status,
                    code=e.code,
                    retry_after=e.retry_after,
                ) from e

        try:
            s = self.get_session(sid)  # type: ignore[attr-defined]
        except errors.NotFound:
            s = make()
        else:
            if s.status in (models.TERMINATED, models.ERROR):
                s = make()
        sleep = self._t._sleep
        attempt = 1
        while True:
            if s.status in (models.RUNNING, models.PAUSED, models.HIBERNATED):
                return sid
            if s.status in (models.ERROR, models.TERMINATED):
                raise errors.SessionCreateFailed(f"session {sid} is {s.status}: {s.error}", session_id=sid)
            if attempt >= tries:
                raise errors.SessionNotReady(
                    f"session {sid} still {s.status} after {tries} tries {interval} s apart", session_id=sid
                )
            sleep(interval)
            s = self.get_session(sid)  # type: ignore[attr-defined]
            attempt += 1

    def agent_execute(
        self,
        agent_id: str,
        user_id: str,
        code: str,
        *,
        template_id: Optional[str] = None,
        language: Optional[str] = None,
        timeout: Optional[float] = None,
        event: Any = None,
        env_vars: Optional[Mapping[str, str]] = None,
        conversation_id: Optional[str] = None,
        context_id: Optional[str] = None,
        wait_timeout: Optional[float] = None,
    ) -> models.Execution:
        """Runs code in the session of a user's agent, which the server
        creates on first use (with ``template_id``, default ``python``; an
        existing session keeps its template), and waits for the result as
        :meth:`execute` does (submit, then :meth:`wait_result`)."""
        body = execution_body(code, language, timeout, event, env_vars, conversation_id, context_id)
        body["user_id"] = user_id
        if template_id is not None:
            body["template_id"] = template_id
        eid = self._submit(_agent_path(agent_id, "/execute"), body)  # type: ignore[attr-defined]
        return self.wait_result(eid, timeout=wait_timeout)  # type: ignore[attr-defined]

    def list_tools(self) -> List[models.Tool]:
        """Returns the tool definitions for LLM function calling:
        ``execute_code``, ``run_bash``, ``upload_file``, ``list_files``,
        ``read_file``. ``[t.raw for t in tools]`` is the list to pass to a
        chat-completions call."""
        _, doc = self._t.call("GET", f"{P}/tools")
        return [models.Tool.from_json(t) for t in (doc or {}).get("tools") or []]

    def invoke_tool(
        self,
        name: str,
        user_id: str,
        agent_id: str,
        arguments: Optional[Mapping[str, Any]] = None,
        conversation_id: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
    ) -> models.ToolResult:
        """Runs the tool call a model made, in the session of the user's
        agent (made on first use). ``arguments`` are the model's (a dict, or
        the JSON string a chat-completions answer carries); with
        ``conversation_id``, code runs with that conversation's uploads in
        view.

        A call that ran and failed (an exception, a missing file) is a
        result with ``is_error`` and ``content`` saying why, for the model to
        see; arguments that break the tool's schema raise
        :class:`InvalidArgument`, an unknown tool :class:`NotFound`.
        ``timeout`` is how long the server may take to answer (default: the
        client's timeout plus the run's ``timeout`` argument, or 300 s).
        """
        if isinstance(arguments, (str, bytes)):
            try:
                arguments = json.loads(arguments)
            except ValueError as e:
                raise errors.InvalidArgument(f"tool {name}: arguments are not JSON: {e}") from e
        body: Dict[str, Any] = {"user_id": user_id, "agent_id": agent_id, "arguments": dict(arguments or {})}
        if conversation_id is not None:
            body["conversation_id"] = conversation_id
        if timeout is None:
            run = body["arguments"].get("timeout")
            timeout = self._t.timeout + (float(run) if isinstance(run, (int, float)) and run > 0 else TOOL_RUN_ALLOWANCE)
        _, doc = self._t.call("POST", f"{P}/tools/{segment('tool', name)}/invoke", body=body, timeout=timeout)
        return models.from_dict(models.ToolResult, doc)

    def chat(
        self,
        agent_id: str,
        user_id: str,
        conversation_id: str,
        message: str,
        *,
        system: Optional[str] = None,
        model: Optional[str] = None,
    ) -> Iterator[models.ChatEvent]:
        """Sends a user's message to a conversation with an agent and yields
        the turn's events as the server sends them (R-33): the server runs
        its configured model with the tools in the session of the user's
        agent, and keeps the conversation's history::

            for ev in c.chat("analyst", "alice", "c1", "Plot data.csv"):
                if ev.name == "delta":
                    print(ev.data["text"], end="")
                elif ev.name == "tool_call":
                    print("\\n[%s %s]" % (ev.data["name"], ev.data["arguments"]))
                elif ev.name == "error":
                    print("\\nerror:", ev.data["message"])

        The last event is ``done``. Leaving the loop early closes the
        connection, which cancels the turn on the server (the model's
        stream and a running tool). ``system`` and ``model`` replace the
        server's for this turn; ``model`` must be one the server offers
        (``--llm-models``), else :class:`InvalidArgument`. A tenant past its
        ``chats`` or ``chat_tokens`` limit gets :class:`ResourceExhausted`.
        A server without a model endpoint raises
        :class:`Unavailable`; a stream that ends before ``done`` raises
        :class:`TransportError`.
        """
        body: Dict[str, Any] = {"user_id": user_id, "conversation_id": conversation_id, "message": message}
        if system is not None:
            body["system"] = system
        if model is not None:
            body["model"] = model
        resp = self._t.request(
            "POST",
            f"{P}/agents/{segment('agent id', agent_id)}/chat",
            body=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            timeout=max(self._t.timeout, STREAM_MIN_TIMEOUT),
        )
        with resp:
            for name, data in json_events(resp, "chat"):
                yield models.ChatEvent(name, data if isinstance(data, dict) else {})
                if name == "done":
                    return
        raise errors.TransportError("chat: the stream ended before its done event")

    def forget_conversation(self, agent_id: str, user_id: str, conversation_id: str) -> None:
        """Deletes a conversation's chat history and, if the user has the
        agent's session, the conversation's files there (R-33, R-23)."""
        self._t.call(
            "DELETE",
            f"{P}/agents/{segment('agent id', agent_id)}/conversations/{segment('conversation id', conversation_id)}",
            query={"user_id": user_id},
            ok=(204,),
        )
