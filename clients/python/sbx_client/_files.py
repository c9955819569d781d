"""A session's files and conversation temp areas (R-20..R-23)."""

from __future__ import annotations

import mimetypes
import os
import secrets
import urllib.parse
from dataclasses import dataclass
from typing import IO, Any, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import errors, models
from ._sessions import _session_path
from ._transport import Transport, decode_json, file_path, segment

_CHUNK = 64 << 10

# What upload takes: a path on disk; an open binary file; or a tuple
# (name, content) or (name, content, content_type) with content bytes, str
# (sent as UTF-8) or an open binary file. A list of these uploads several
# files in one request.
FileSpec = Union[str, "os.PathLike[str]", IO[bytes], Tuple[Any, ...]]
Files = Union[FileSpec, Sequence[FileSpec]]


@dataclass
class _Part:
    name: str
    content_type: str
    data: Union[bytes, IO[bytes]]


def _parts(files: Files) -> Tuple[List[_Part], List[IO[bytes]]]:
    """Normalizes upload's files; returns the parts and the files it opened
    (to close). Paths are opened now, so a missing file fails before the
    request."""
    items = files if isinstance(files, list) else [files]
    if not items:
        raise errors.InvalidArgument("upload: no files")
    parts: List[_Part] = []
    opened: List[IO[bytes]] = []
    try:
        for it in items:
            ctype = None
            if isinstance(it, tuple):
                if len(it) not in (2, 3):
                    raise errors.InvalidArgument("upload: a tuple is (name, content) or (name, content, content_type)")
                name, data = it[0], it[1]
                ctype = it[2] if len(it) == 3 else None
                if isinstance(data, str):
                    data = data.encode("utf-8")
                elif isinstance(data, (bytearray, memoryview)):
                    data = bytes(data)
            elif isinstance(it, (str, os.PathLike)):
                name = os.path.basename(os.fspath(it))
                data = open(it, "rb")
                opened.append(data)
            elif hasattr(it, "read"):
                name = os.path.basename(str(getattr(it, "name", "") or ""))
                data = it
            else:
                raise errors.InvalidArgument(f"upload: cannot upload a {type(it).__name__}")
            if not isinstance(data, bytes) and not hasattr(data, "read"):
                raise errors.InvalidArgument(f"upload: {name!r}: content must be bytes, str or a binary file")
            name = str(name).replace("\\", "/").rsplit("/", 1)[-1]
            if name in ("", ".", "..") or any(c in name for c in "\r\n\0"):
                raise errors.InvalidArgument(f"upload: file name {name!r}: want a plain file name")
            if not ctype:
                ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
            parts.append(_Part(name, ctype, data))
    except BaseException:
        for f in opened:
            f.close()
        raise
    return parts, opened


def _multipart(fields: Sequence[Tuple[str, Optional[str]]], parts: Sequence[_Part]) -> Tuple[str, Iterator[bytes]]:
    """A multipart/form-data body, produced as it is sent: the text fields
    first (the server needs them before the files), then each file, read a
    piece at a time, never held whole."""
    boundary = "sbx" + secrets.token_hex(16)

    def gen() -> Iterator[bytes]:
        for name, value in fields:
            if value:
                yield (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n').encode()
        for p in parts:
            quoted = p.name.replace("\\", "\\\\").replace('"', '\\"')
            yield (
                f"--{boundary}\r\n"
                f'Content-Disposition: form-data; name="file"; filename="{quoted}"\r\n'
                f"Content-Type: {p.content_type}\r\n\r\n"
            ).encode("utf-8")
            if isinstance(p.data, bytes):
                yield p.data
            else:
                while True:
                    chunk = p.data.read(_CHUNK)
                    if not chunk:
                        break
                    if not isinstance(chunk, bytes):
                        raise errors.InvalidArgument(f"upload: {p.name!r}: the file must be opened in binary mode")
                    yield chunk
            yield b"\r\n"
        yield f"--{boundary}--\r\n".encode()

    return f"multipart/form-data; boundary={boundary}", gen()


def _agent_path(agent_id: str, rest: str) -> str:
    return f"/api/v1/agents/{segment('agent id', agent_id)}{rest}"


class FilesMixin:
    """File calls of :class:`sbx_client.Client`."""

    _t: Transport

    def upload(
        self,
        session_id: str,
        files: Files,
        *,
        path: Optional[str] = None,
        conversation_id: Optional[str] = None,
        subdir: Optional[str] = None,
    ) -> List[models.UploadedFile]:
        """Uploads files into the session, streamed (never held whole in
        memory); the server stores all of them or none.

        Args:
            files: a path on disk (str or os.PathLike), an open binary file,
                a tuple ``(name, content)`` or ``(name, content,
                content_type)`` with content bytes, str (UTF-8) or an open
                binary file; or a list of these. The media type is guessed
                from the name unless given.
            path: the destination in the workspace: a directory ending in
                "/", or for a single file its full path (default: each
                file's name at the top of the workspace or temp area).
            conversation_id: put the files in that conversation's temp
                area, which only its code sees (at
                ``/workspace/uploads/temparea/``).
            subdir: the conversation's area, "temparea" (the default).

        Returns the stored files: ``path`` is the name for the other file
        calls, ``sandbox_path`` where the code sees it. Over the session's
        size limit: :class:`PayloadTooLarge`; a type it does not allow:
        :class:`UnsupportedMediaType`; too many files: :class:`Unprocessable`
        or :class:`Conflict`.
        """
        return self._upload(_session_path(session_id, "/files/upload"), None, files, path, conversation_id, subdir)

    def _upload(
        self,
        url_path: str,
        query: Optional[Mapping[str, Any]],
        files: Files,
        path: Optional[str],
        conversation_id: Optional[str],
        subdir: Optional[str],
    ) -> List[models.UploadedFile]:
        parts, opened = _parts(files)
        try:
            ctype, body = _multipart([("path", path), ("conversation_id", conversation_id), ("subdir", subdir)], parts)
            resp = self._t.request(
                "POST", url_path, query=query, body=body, headers={"Content-Type": ctype}, ok=(201,)
            )
            doc = decode_json(resp.read(), "upload", resp.status) or {}
        finally:
            for f in opened:
                f.close()
        return [models.from_dict(models.UploadedFile, f) for f in doc.get("files") or []]

    def list_files(
        self,
        session_id: str,
        path: Optional[str] = None,
        *,
        recursive: bool = False,
        conversation_id: Optional[str] = None,
        subdir: Optional[str] = None,
    ) -> models.FileList:
        """Lists a directory of the workspace (``path``, default the top;
        ``recursive`` for the whole tree), or with ``conversation_id`` that
        conversation's uploads only (``path`` then relative to its temp
        area)."""
        q = {"path": path, "recursive": True if recursive else None, "conversation_id": conversation_id, "subdir": subdir}
        _, doc = self._t.call("GET", _session_path(session_id, "/files"), query=q)
        return models.from_dict(models.FileList, doc)

    def download(self, session_id: str, path: str, *, offset: int = 0, length: Optional[int] = None) -> bytes:
        """Returns a file of the workspace, or ``length`` bytes of it from
        ``offset`` on (a Range request). An offset past the end is
        :class:`InvalidArgument` (416)."""
        return b"".join(self._open(_session_path(session_id, "/files/" + file_path(path)), None, offset, length))

    def download_to(
        self, session_id: str, path: str, out: IO[bytes], *, offset: int = 0, length: Optional[int] = None
    ) -> int:
        """Writes a file of the workspace (or ``length`` bytes of it from
        ``offset`` on) to the binary file object ``out`` as it arrives;
        returns how many bytes it wrote."""
        return _copy(self._open(_session_path(session_id, "/files/" + file_path(path)), None, offset, length), out)

    def _open(
        self, url_path: str, query: Optional[Mapping[str, Any]], offset: int, length: Optional[int]
    ) -> Iterator[bytes]:
        if not isinstance(offset, int) or offset < 0 or (length is not None and (not isinstance(length, int) or length <= 0)):
            raise errors.InvalidArgument(f"download: offset {offset!r}, length {length!r}: want offset >= 0, length > 0")
        headers = {"Accept": "*/*"}
        if length is not None:
            headers["Range"] = f"bytes={offset}-{offset + length - 1}"
        elif offset > 0:
            headers["Range"] = f"bytes={offset}-"
        resp = self._t.request("GET", url_path, query=query, headers=headers, ok=(200, 206))
        return _ranged(resp, offset if resp.status == 200 else 0, length)

    def presign(self, session_id: str, path: str, expires_in: Optional[int] = None) -> models.Presign:
        """Returns a URL that downloads the file without an API key until it
        expires (``expires_in`` seconds, default 3600, at most 604800)."""
        q = {"presign": True, "expires_in": expires_in}
        _, doc = self._t.call("GET", _session_path(session_id, "/files/" + file_path(path)), query=q)
        p = models.from_dict(models.Presign, doc)
        p.url = urllib.parse.urljoin(self._t.base_url + "/", p.url)
        return p

    def delete_file(self, session_id: str, path: str, *, recursive: bool = False) -> None:
        """Deletes a file, or a directory (one that is not empty needs
        ``recursive``)."""
        q = {"recursive": True} if recursive else None
        self._t.call("DELETE", _session_path(session_id, "/files/" + file_path(path)), query=q, ok=(204,))

    def delete_conversation(self, session_id: str, conversation_id: str) -> None:
        """Purges a conversation's uploads (and stateful contexts) at once and
        for good. Purging one without files succeeds."""
        p = _session_path(session_id, "/conversations/" + segment("conversation id", conversation_id))
        self._t.call("DELETE", p, ok=(204,))

    # The agent endpoints' file calls (R-30): they name an agent and a user;
    # the session is sb-session-{user_id}-{agent_id}.

    def agent_upload(
        self,
        agent_id: str,
        user_id: str,
        files: Files,
        *,
        path: Optional[str] = None,
        conversation_id: Optional[str] = None,
        subdir: Optional[str] = None,
    ) -> List[models.UploadedFile]:
        """Uploads files into the session of a user's agent, which the server
        creates on first use. Arguments as for :meth:`upload`."""
        return self._upload(_agent_path(agent_id, "/files/upload"), {"user_id": user_id}, files, path, conversation_id, subdir)

    def agent_list_files(
        self,
        agent_id: str,
        user_id: str,
        path: Optional[str] = None,
        *,
        recursive: bool = False,
        conversation_id: Optional[str] = None,
        subdir: Optional[str] = None,
    ) -> models.FileList:
        """Lists files of the session of a user's agent (:class:`NotFound`
        if the user has none yet). Arguments as for :meth:`list_files`."""
        q = {
            "user_id": user_id,
            "path": path,
            "recursive": True if recursive else None,
            "conversation_id": conversation_id,
            "subdir": subdir,
        }
        _, doc = self._t.call("GET", _agent_path(agent_id, "/files"), query=q)
        return models.from_dict(models.FileList, doc)

    def agent_download(
        self,
        agent_id: str,
        user_id: str,
        path: str,
        *,
        conversation_id: Optional[str] = None,
        offset: int = 0,
        length: Optional[int] = None,
    ) -> bytes:
        """Returns a file of the session of a user's agent; with
        ``conversation_id``, ``path`` is in that conversation's temp area.
        ``offset`` and ``length`` as for :meth:`download`."""
        q = {"user_id": user_id, "conversation_id": conversation_id}
        return b"".join(self._open(_agent_path(agent_id, "/files/" + file_path(path)), q, offset, length))

    def agent_download_to(
        self,
        agent_id: str,
        user_id: str,
        path: str,
        out: IO[bytes],
        *,
        conversation_id: Optional[str] = None,
        offset: int = 0,
        length: Optional[int] = None,
    ) -> int:
        """:meth:`agent_download` into the binary file object ``out``;
        returns how many bytes it wrote."""
        q = {"user_id": user_id, "conversation_id": conversation_id}
        return _copy(self._open(_agent_path(agent_id, "/files/" + file_path(path)), q, offset, length), out)


def _ranged(resp, skip: int, length: Optional[int]) -> Iterator[bytes]:
    """The body of a download: skip bytes dropped (the server ignored the
    Range and sent it all), then at most length bytes."""
    left = length
    try:
        for chunk in resp.chunks():
            if skip:
                if len(chunk) <= skip:
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
            if left is not None:
                chunk = chunk[:left]
                left -= len(chunk)
            if chunk:
                yield chunk
            if left == 0:
                break
    finally:
        resp.close()


def _copy(chunks: Iterator[bytes], out: IO[bytes]) -> int:
    n = 0
    for chunk in chunks:
        out.write(chunk)
        n += len(chunk)
    return n
