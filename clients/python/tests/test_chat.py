"""The chat loop's events (R-33) against a fake server."""

import json
import unittest

import sbx_client
from fakeserver import FakeServer, Reply, error


def ev(name, obj):
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()


DONE = ev("done", {"session_id": "sb-session-alice-analyst", "conversation_id": "c1", "steps": 2})


class ChatTest(unittest.TestCase):
    def serve(self, reply):
        srv = FakeServer()
        self.addCleanup(srv.close)
        srv.route("POST", r"/api/v1/agents/analyst/chat", lambda r: reply)
        srv.route("DELETE", r"/api/v1/agents/analyst/conversations/c1", lambda r: Reply(204))
        c = sbx_client.Client(srv.url, timeout=5)
        self.addCleanup(c.close)
        return c, srv

    def test_events_in_order(self):
        stream = (
            ev("delta", {"text": "Let me "})
            + b": keep-alive\n\n"
            + ev("delta", {"text": "look."})
            + ev("tool_call", {"id": "x", "name": "read_file", "arguments": '{"path":"a.txt"}'})
            + ev("tool_result", {"id": "x", "name": "read_file", "content": "hi", "is_error": False})
            + ev("message", {"role": "assistant", "content": "It says hi."})
            + DONE
        )
        c, srv = self.serve(Reply(200, headers={"Content-Type": "text/event-stream"}, chunks=[stream[i : i + 5] for i in range(0, len(stream), 5)]))
        evs = list(c.chat("analyst", "alice", "c1", "What is in a.txt?", model="m2"))
        self.assertEqual([e.name for e in evs], ["delta", "delta", "tool_call", "tool_result", "message", "done"])
        self.assertEqual("".join(e.data["text"] for e in evs if e.name == "delta"), "Let me look.")
        self.assertEqual(evs[-1].data["steps"], 2)
        req = srv.requests[0]
        self.assertEqual(req.json(), {"user_id": "alice", "conversation_id": "c1", "message": "What is in a.txt?", "model": "m2"})
        self.assertEqual(req.headers.get("accept"), "text/event-stream")

    def test_stream_cut_before_done(self):
        c, _ = self.serve(Reply(200, headers={"Content-Type": "text/event-stream"}, chunks=[ev("delta", {"text": "a"})]))
        got = []
        with self.assertRaises(sbx_client.TransportError):
            for e in c.chat("analyst", "alice", "c1", "hi"):
                got.append(e.name)
        self.assertEqual(got, ["delta"])

    def test_no_model(self):
        c, _ = self.serve(error(503, "unavailable", "this server has no model endpoint", **{"Retry-After": "5"}))
        with self.assertRaises(sbx_client.Unavailable):
            list(c.chat("analyst", "alice", "c1", "hi"))

    def test_forget(self):
        c, srv = self.serve(Reply(204))
        c.forget_conversation("analyst", "alice", "c1")
        self.assertEqual((srv.requests[0].method, srv.requests[0].q("user_id")), ("DELETE", "alice"))


if __name__ == "__main__":
    unittest.main()
