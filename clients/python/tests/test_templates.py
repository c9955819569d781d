"""Templates over the API (R-40) against a fake server."""

import json
import unittest

import sbx_client
from fakeserver import FakeServer, Reply, error

BUILD = {"build_id": "bld_1", "hash": "ab" * 32, "status": "queued", "queued_at": "2026-11-27T12:00:00Z"}
QUEUED = {"name": "mine", "source": "tenant", "status": "queued", "hash": "ab" * 32, "runtime": "runc", "release": "bookworm", "build": BUILD}
READY = dict(QUEUED, status="ready", size_bytes=5 << 20, build=dict(BUILD, status="ready"),
             versions=[{"hash": "ab" * 32, "build_id": "bld_1", "size_bytes": 5 << 20, "built_at": "2026-11-27T12:00:09Z"}])


def ev(name, obj):
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()


class TemplatesTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.c = sbx_client.Client(self.srv.url, timeout=5)
        self.addCleanup(self.c.close)

    def test_build_and_follow(self):
        self.srv.route("POST", r"/api/v1/templates", lambda r: Reply(202, json=QUEUED))
        stream = ev("log", {"text": "[1/5] base\n"}) + b": keep-alive\n\n" + ev("log", {"text": "[5/5] done\n"}) + ev("end", READY)
        self.srv.route("GET", r"/api/v1/templates/mine/builds/bld_1/logs",
                       lambda r: Reply(200, headers={"Content-Type": "text/event-stream"}, chunks=[stream[i : i + 7] for i in range(0, len(stream), 7)]))
        t, queued = self.c.create_template({"name": "mine", "packages": ["jq"]})
        self.assertTrue(queued)
        self.assertEqual((t.status, t.build.build_id), ("queued", "bld_1"))
        self.assertEqual(self.srv.requests[0].json(), {"name": "mine", "packages": ["jq"]})
        lines = []
        end = self.c.follow_template_build("mine", t.build.build_id, lines.append)
        self.assertEqual(lines, ["[1/5] base\n", "[5/5] done\n"])
        self.assertEqual((end.status, end.size_bytes, len(end.versions)), ("ready", 5 << 20, 1))
        self.assertEqual(self.srv.requests[-1].headers.get("accept"), "text/event-stream")

    def test_ready_at_once_list_delete(self):
        self.srv.route("POST", r"/api/v1/templates", lambda r: Reply(200, json=READY))
        self.srv.route("GET", r"/api/v1/templates", lambda r: Reply(json={"templates": [READY]}))
        self.srv.route("DELETE", r"/api/v1/templates/mine", lambda r: error(409, "failed_precondition", "sessions use it") if r.q("force") is None else Reply(204))
        t, queued = self.c.create_template({"name": "mine"})
        self.assertFalse(queued)
        self.assertEqual(t.status, "ready")
        self.assertEqual([x.name for x in self.c.list_templates()], ["mine"])
        with self.assertRaises(sbx_client.Conflict):
            self.c.delete_template("mine")
        self.c.delete_template("mine", force=True)
        self.assertEqual(self.srv.requests[-1].q("force"), "true")

    def test_stream_cut(self):
        self.srv.route("GET", r"/api/v1/templates/mine/builds/bld_1/logs",
                       lambda r: Reply(200, headers={"Content-Type": "text/event-stream"}, chunks=[ev("log", {"text": "x\n"})]))
        with self.assertRaises(sbx_client.TransportError):
            self.c.follow_template_build("mine", "bld_1")


if __name__ == "__main__":
    unittest.main()
