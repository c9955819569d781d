"""File calls against a fake server: multipart uploads, ranges, presign."""

import email.parser
import email.policy
import io
import os
import tempfile
import unittest

import sbx_client
from fakeserver import FakeServer, Reply, error

CONTENT = bytes(range(256)) * 40  # 10240 bytes


def multipart(req):
    """The parts of a multipart/form-data request: [(name, filename,
    content type, bytes)], in order."""
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + req.headers["content-type"].encode() + b"\r\n\r\n" + req.body
    )
    self_check = msg.is_multipart()
    assert self_check, req.headers["content-type"]
    return [
        (p.get_param("name", header="content-disposition"), p.get_filename(), p.get_content_type(), p.get_payload(decode=True))
        for p in msg.iter_parts()
    ]


def ranged(r, content=CONTENT):
    """Serves content as a file server does: a Range gets 206."""
    rng = r.headers.get("range")
    if not rng:
        return Reply(200, body=content, headers={"Content-Type": "application/octet-stream"})
    first, _, last = rng[len("bytes=") :].partition("-")
    first = int(first)
    if first >= len(content):
        return Reply(416, body=b"invalid range: failed to overlap", headers={"Content-Type": "text/plain"})
    last = int(last) if last else len(content) - 1
    return Reply(206, body=content[first : last + 1], headers={"Content-Range": f"bytes {first}-{last}/{len(content)}"})


class FilesTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.c = sbx_client.Client(self.srv.url, timeout=5)
        self.addCleanup(self.c.close)

    def uploaded(self, r, *_):
        files = [
            {
                "name": fn,
                "path": f"uploads/c1/temparea/{fn}",
                "sandbox_path": f"/workspace/uploads/temparea/{fn}",
                "size": len(data),
                "sha256": "00",
            }
            for name, fn, _, data in multipart(r)
            if name == "file"
        ]
        return Reply(201, json={"files": files})

    def test_upload_forms(self):
        self.srv.route("POST", r"/api/v1/sessions/s1/files/upload", self.uploaded)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "data.csv")
            with open(path, "wb") as f:
                f.write(b"a,b\n1,2\n")
            with open(path, "rb") as fobj:
                out = self.c.upload(
                    "s1",
                    [
                        path,
                        ("notes.txt", "h\u00e9llo"),
                        ("blob", CONTENT, "application/x-custom"),
                        ('we"ird\\name.bin', io.BytesIO(b"xyz")),
                        fobj,
                    ],
                    conversation_id="c1",
                    subdir="temparea",
                )
        req = self.srv.requests[0]
        self.assertEqual(req.headers.get("transfer-encoding"), "chunked")  # streamed, not buffered
        parts = multipart(req)
        self.assertEqual(
            parts,
            [
                ("conversation_id", None, "text/plain", b"c1"),
                ("subdir", None, "text/plain", b"temparea"),
                ("file", "data.csv", "text/csv", b"a,b\n1,2\n"),
                ("file", "notes.txt", "text/plain", "h\u00e9llo".encode()),
                ("file", "blob", "application/x-custom", CONTENT),
                ("file", "name.bin", "application/octet-stream", b"xyz"),
                ("file", "data.csv", "text/csv", b"a,b\n1,2\n"),
            ],
        )
        self.assertEqual([u.name for u in out], ["data.csv", "notes.txt", "blob", "name.bin", "data.csv"])
        self.assertEqual(out[0].sandbox_path, "/workspace/uploads/temparea/data.csv")

    def test_upload_quotes_file_names(self):
        self.srv.route("POST", r"/api/v1/sessions/s1/files/upload", self.uploaded)
        self.c.upload("s1", ('a "quoted" n\u00e4me.txt', b"1"), path="dir/")
        parts = multipart(self.srv.requests[0])
        self.assertEqual(parts[0], ("path", None, "text/plain", b"dir/"))
        self.assertEqual(parts[1][1], 'a "quoted" n\u00e4me.txt')

    def test_missing_file_fails_before_the_request(self):
        with self.assertRaises(FileNotFoundError):
            self.c.upload("s1", "/nonexistent/data.csv")
        self.assertEqual(self.srv.requests, [])

    def test_upload_refused_before_the_body_is_read(self):
        # The server answers 413 as soon as it sees the file is too large
        # and closes; the client reports the server's answer, not the
        # broken pipe.
        self.srv.route(
            "POST",
            r"/api/v1/sessions/s1/files/upload",
            lambda r: error(413, "payload_too_large", "file big.bin is over the session's limit of 1 MB"),
            read_body=False,
        )
        with self.assertRaises(sbx_client.PayloadTooLarge) as cm:
            self.c.upload("s1", ("big.bin", io.BytesIO(b"\0" * (64 << 20))))
        self.assertIn("limit of 1 MB", cm.exception.message)

    def test_download_ranges(self):
        self.srv.route("GET", r"/api/v1/sessions/s1/files/(.+)", lambda r, p: ranged(r))
        self.assertEqual(self.c.download("s1", "d/x.bin"), CONTENT)
        self.assertNotIn("range", self.srv.requests[-1].headers)
        self.assertEqual(self.c.download("s1", "d/x.bin", offset=100, length=50), CONTENT[100:150])
        self.assertEqual(self.srv.requests[-1].headers["range"], "bytes=100-149")
        self.assertEqual(self.c.download("s1", "d/x.bin", offset=10000), CONTENT[10000:])
        self.assertEqual(self.srv.requests[-1].headers["range"], "bytes=10000-")
        self.assertEqual(self.c.download("s1", "x", offset=10200, length=1000), CONTENT[10200:])
        out = io.BytesIO()
        self.assertEqual(self.c.download_to("s1", "x", out, offset=5, length=5000), 5000)
        self.assertEqual(out.getvalue(), CONTENT[5:5005])
        with self.assertRaises(sbx_client.InvalidArgument) as cm:
            self.c.download("s1", "x", offset=len(CONTENT))
        self.assertEqual(cm.exception.status, 416)

    def test_download_when_the_server_ignores_range(self):
        self.srv.route("GET", r"/api/v1/sessions/s1/files/(.+)", lambda r, p: Reply(200, body=CONTENT))
        self.assertEqual(self.c.download("s1", "x", offset=8800, length=3), CONTENT[8800:8803])
        out = io.BytesIO()
        self.assertEqual(self.c.download_to("s1", "x", out, offset=9000), len(CONTENT) - 9000)
        self.assertEqual(out.getvalue(), CONTENT[9000:])

    def test_list_presign_delete(self):
        s = self.srv
        s.route(
            "GET",
            r"/api/v1/sessions/s1/files",
            lambda r: Reply(
                200, json={"files": [{"name": "a", "path": "d/a", "type": "file", "size": 3, "modified_at": "2026-11-24T10:00:00Z"}]}
            ),
        )
        s.route(
            "GET",
            r"/api/v1/sessions/s1/files/(.+)",
            lambda r, p: Reply(200, json={"url": f"/api/v1/presigned/ab/{p}?sig=1", "expires_at": "2026-11-24T11:00:00Z"}),
        )
        s.route("DELETE", r"/api/v1/sessions/s1/files/(.+)", lambda r, p: Reply(204))
        s.route("DELETE", r"/api/v1/sessions/s1/conversations/(.+)", lambda r, c: Reply(204))
        fl = self.c.list_files("s1", "d", recursive=True)
        self.assertEqual((fl.files[0].path, fl.files[0].size, fl.files[0].modified_at.hour), ("d/a", 3, 10))
        self.assertEqual(s.requests[-1].query, {"path": ["d"], "recursive": ["true"]})
        self.c.list_files("s1", conversation_id="c1", subdir="temparea")
        self.assertEqual(s.requests[-1].query, {"conversation_id": ["c1"], "subdir": ["temparea"]})
        p = self.c.presign("s1", "d/a", expires_in=60)
        self.assertEqual(p.url, self.srv.url + "/api/v1/presigned/ab/d/a?sig=1")
        self.assertEqual(s.requests[-1].query, {"presign": ["true"], "expires_in": ["60"]})
        self.c.delete_file("s1", "d", recursive=True)
        self.assertEqual((s.requests[-1].path, s.requests[-1].query), ("/api/v1/sessions/s1/files/d", {"recursive": ["true"]}))
        self.c.delete_conversation("s1", "c1")
        self.assertEqual(s.requests[-1].path, "/api/v1/sessions/s1/conversations/c1")

    def test_agent_file_calls(self):
        s = self.srv
        s.route("POST", r"/api/v1/agents/a1/files/upload", self.uploaded)
        s.route("GET", r"/api/v1/agents/a1/files", lambda r: Reply(200, json={"files": []}))
        s.route("GET", r"/api/v1/agents/a1/files/(.+)", lambda r, p: ranged(r))
        self.c.agent_upload("a1", "u1", ("q.txt", b"?"), conversation_id="c1")
        self.assertEqual(s.requests[-1].query, {"user_id": ["u1"]})
        self.assertEqual(multipart(s.requests[-1])[0], ("conversation_id", None, "text/plain", b"c1"))
        self.c.agent_list_files("a1", "u1", recursive=True, conversation_id="c1")
        self.assertEqual(s.requests[-1].query, {"user_id": ["u1"], "recursive": ["true"], "conversation_id": ["c1"]})
        self.assertEqual(self.c.agent_download("a1", "u1", "q.txt", conversation_id="c1", offset=1, length=2), CONTENT[1:3])
        self.assertEqual(s.requests[-1].path, "/api/v1/agents/a1/files/q.txt")
        self.assertEqual(s.requests[-1].query, {"user_id": ["u1"], "conversation_id": ["c1"]})
        out = io.BytesIO()
        self.assertEqual(self.c.agent_download_to("a1", "u1", "q.txt", out), len(CONTENT))


class ToolsTest(unittest.TestCase):
    def test_tools(self):
        srv = FakeServer()
        self.addCleanup(srv.close)
        fn = {"name": "read_file", "description": "Read part of a file", "parameters": {"type": "object"}}
        tool = {"type": "function", "function": fn}
        srv.route("GET", r"/api/v1/tools", lambda r: Reply(200, json={"tools": [tool]}))
        srv.route(
            "POST",
            r"/api/v1/tools/read_file/invoke",
            lambda r: Reply(200, json={"content": "x", "is_error": False, "session_id": "sb-session-u1-a1", "data": {"eof": True}}),
        )
        c = sbx_client.Client(srv.url, timeout=5)
        self.addCleanup(c.close)
        tools = c.list_tools()
        self.assertEqual((tools[0].name, tools[0].parameters, tools[0].raw), ("read_file", {"type": "object"}, tool))
        res = c.invoke_tool("read_file", "u1", "a1", {"path": "a", "offset": 0}, conversation_id="c1")
        self.assertEqual(
            srv.requests[-1].json(),
            {"user_id": "u1", "agent_id": "a1", "arguments": {"path": "a", "offset": 0}, "conversation_id": "c1"},
        )
        self.assertEqual((res.content, res.is_error, res.session_id, res.data), ("x", False, "sb-session-u1-a1", {"eof": True}))
        c.invoke_tool("read_file", "u1", "a1", '{"path": "b"}')  # as a chat-completions answer carries them
        self.assertEqual(srv.requests[-1].json()["arguments"], {"path": "b"})


if __name__ == "__main__":
    unittest.main()
