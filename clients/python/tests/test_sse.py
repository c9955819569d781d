"""The event stream parser, and execute_stream against a fake server."""

import json
import random
import unittest

import sbx_client
from fakeserver import FakeServer, Reply, error, execution_json
from sbx_client.sse import SSEParser


def parse(chunks):
    p = SSEParser()
    out = []
    for c in chunks:
        out += [f"{e.name}={e.data}" for e in p.feed(c)]
    return out


def splits(data: bytes):
    """The stream whole, a byte at a time, and cut at random places."""
    yield "whole", [data]
    yield "bytes", [data[i : i + 1] for i in range(len(data))]
    rnd = random.Random(len(data))
    for k in range(5):
        cuts = sorted(rnd.sample(range(1, len(data)), min(4, len(data) - 1))) if len(data) > 1 else []
        yield f"random{k}", [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


class SSEParserTest(unittest.TestCase):
    def test_streams(self):
        cases = [
            ("lf", "event: a\ndata: 1\n\nevent: b\ndata: 2\n\n", ["a=1", "b=2"]),
            ("crlf", "event: a\r\ndata: 1\r\n\r\n", ["a=1"]),
            ("cr", "event: a\rdata: 1\r\revent: b\rdata: 2\r\r", ["a=1", "b=2"]),
            ("multi-line data", "data: line 1\ndata: line 2\ndata:\n\n", ["message=line 1\nline 2\n"]),
            ("comments and unknown fields", ": hi\nid: 7\nretry: 10\nfoo: bar\nevent: a\n: mid\ndata: 1\n\n", ["a=1"]),
            ("keep-alive between events", "event: a\ndata: 1\n\n: keep-alive\n\nevent: b\ndata: 2\n\n", ["a=1", "b=2"]),
            ("no space after colon", "event:a\ndata:1\n\n", ["a=1"]),
            ("only one space dropped", "data:  two\n\n", ["message= two"]),
            ("field without colon", "event: a\ndata\n\n", ["a="]),
            ("event without data is none", "event: a\n\nevent: b\ndata: 2\n\n", ["b=2"]),
            ("colon in data", 'data: {"a":"b:c"}\n\n', ['message={"a":"b:c"}']),
            ("byte order mark", "\ufeffevent: a\ndata: 1\n\n", ["a=1"]),
            ("unfinished event dropped", "event: a\ndata: 1\n\nevent: b\ndata: 2", ["a=1"]),
            ("blank lines between", "\n\n\nevent: a\ndata: 1\n\n\n\n", ["a=1"]),
            ("utf-8 across reads", "data: h\u00e9llo \u2603 \U0001f600\n\n", ["message=h\u00e9llo \u2603 \U0001f600"]),
        ]
        for name, stream, want in cases:
            for how, chunks in splits(stream.encode("utf-8")):
                with self.subTest(name=name, split=how):
                    self.assertEqual(parse(chunks), want)

    def test_cr_lf_split_across_reads_is_one_line_end(self):
        # A CR ending one read and the LF starting the next are one line
        # end, not an empty line (which would end the event early).
        self.assertEqual(parse([b"event: a\r", b"\ndata: 1\r", b"\n\r", b"\n"]), ["a=1"])
        self.assertEqual(parse([b"data: x\r", b"\r"]), ["message=x"])

    def test_long_line_in_many_reads(self):
        big = "x" * 300000
        data = f"event: result\ndata: {big}\n\n".encode()
        self.assertEqual(parse([data[i : i + 1000] for i in range(0, len(data), 1000)]), ["result=" + big])


def ev(name, obj):
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()


SUBMITTED = ev("submitted", {"execution_id": "exec-9", "status": "submitted"})


class ExecuteStreamTest(unittest.TestCase):
    def serve(self, chunks, ctype="text/event-stream"):
        srv = FakeServer()
        self.addCleanup(srv.close)
        srv.route("POST", r"/api/v1/sessions/s1/execute", lambda r: Reply(200, headers={"Content-Type": ctype}, chunks=chunks))
        c = sbx_client.Client(srv.url, timeout=5)
        self.addCleanup(c.close)
        return c, srv

    def test_output_in_order_then_result(self):
        result = ev("result", execution_json("exec-9", "completed", stdout="a\nc", stderr="b\n", return_value=7))
        stream = (
            SUBMITTED
            + ev("stdout", {"text": "a\n"})
            + b"event: stderr\r\ndata: {\"text\":\"b\\n\"}\r\n\r\n"
            + b": keep-alive\n\n"
            + ev("progress", {})  # a later version's event
            + ev("stdout", {"text": "c"})
            + result
        )
        # Events cut mid-line, across chunked-encoding chunks.
        chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
        c, srv = self.serve(chunks)
        got = []
        x = c.execute_stream("s1", "print(1)", lambda s, t: got.append((s, t)), conversation_id="c1", timeout=5)
        self.assertEqual(got, [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "c")])
        self.assertEqual((x.execution_id, x.status, x.return_value), ("exec-9", "completed", 7))
        req = srv.requests[0]
        self.assertEqual(req.headers["accept"], "text/event-stream")
        self.assertEqual(req.json(), {"code": "print(1)", "conversation_id": "c1", "timeout": 5})

    def test_error_event(self):
        c, _ = self.serve([SUBMITTED, ev("error", {"error": {"code": "unavailable", "message": "no sandbox"}})])
        with self.assertRaises(sbx_client.Unavailable) as cm:
            c.execute_stream("s1", "1")
        self.assertEqual((cm.exception.status, cm.exception.execution_id), (503, "exec-9"))

    def test_stream_ends_before_result(self):
        c, _ = self.serve([SUBMITTED, ev("stdout", {"text": "x"}), b"event: result\ndata: {"])
        with self.assertRaises(sbx_client.ResultNotReceived) as cm:
            c.execute_stream("s1", "1")
        self.assertEqual(cm.exception.execution_id, "exec-9")
        c, _ = self.serve([b": nothing\n\n"])
        with self.assertRaises(sbx_client.ResultNotReceived) as cm:
            c.execute_stream("s1", "1")
        self.assertIsNone(cm.exception.execution_id)

    def test_not_an_event_stream(self):
        c, _ = self.serve([b'{"execution_id":"e"}'], ctype="application/json")
        with self.assertRaises(sbx_client.SbxError):
            c.execute_stream("s1", "1")

    def test_error_status(self):
        srv = FakeServer()
        self.addCleanup(srv.close)
        srv.route("POST", r"/api/v1/sessions/s1/execute", lambda r: error(404, "not_found", "no session s1"))
        with sbx_client.Client(srv.url) as c, self.assertRaises(sbx_client.NotFound):
            c.execute_stream("s1", "1")

    def test_callback_errors_propagate(self):
        c, _ = self.serve([SUBMITTED, ev("stdout", {"text": "x"}), ev("result", execution_json("exec-9"))])

        def boom(stream, text):
            raise ValueError("from the callback")

        with self.assertRaisesRegex(ValueError, "from the callback"):
            c.execute_stream("s1", "1", boom)


if __name__ == "__main__":
    unittest.main()
