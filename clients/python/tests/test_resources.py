"""Resource sync against a fake server that keeps a manifest and a content
store as the real one does."""

import hashlib
import unittest

import sbx_client
from fakeserver import FakeServer, Reply, error


def sha(b):
    return hashlib.sha256(b).hexdigest()


class ResourceServer:
    """The server side of R-34: content by SHA-256, one manifest in place."""

    def __init__(self, srv):
        self.content = {}
        self.placed = {}  # name -> sha256 in place
        self.syncs = 0
        self.lose = lambda n: False  # whether sync n forgets all content, to make a client retry
        srv.route("PUT", r"/api/v1/sessions/s1/resources", self.sync)
        srv.route("GET", r"/api/v1/sessions/s1/resources", self.list)
        srv.route("PUT", r"/api/v1/resources/([0-9a-f]{64})", self.put)

    def sync(self, r):
        want = {x["name"]: x for x in r.json()["resources"]}
        self.syncs += 1
        if self.lose(self.syncs):
            self.content.clear()
        added, changed, needed = [], [], []
        removed = sorted(n for n in self.placed if n not in want)
        for n in removed:
            del self.placed[n]
        for n, x in sorted(want.items()):
            if self.placed.get(n) == x["sha256"]:
                continue
            if x["sha256"] not in self.content:
                needed.append(x)
                continue
            (changed if n in self.placed else added).append(n)
            self.placed[n] = x["sha256"]
        unchanged = len(want) - len(added) - len(changed) - len(needed)
        return Reply(json={"path": "/workspace/.resources", "complete": not needed, "needed": needed,
                           "added": added, "changed": changed, "removed": removed, "unchanged": unchanged})

    def list(self, r):
        return Reply(json={"path": "/workspace/.resources",
                           "resources": [{"name": n, "sha256": h, "size": len(self.content[h])} for n, h in sorted(self.placed.items())]})

    def put(self, r, h):
        if sha(r.body) != h:
            return error(400, "invalid_argument", "content does not match its sha256")
        new = h not in self.content
        self.content[h] = r.body
        return Reply(201 if new else 200, json={"sha256": h, "size": len(r.body)})


class ResourcesTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.rs = ResourceServer(self.srv)
        self.c = sbx_client.Client(self.srv.url, timeout=5)
        self.addCleanup(self.c.close)

    def test_sync_sends_only_what_changed(self):
        skills = {"skills/pdf/SKILL.md": b"# pdf\n", "skills/csv/SKILL.md": "# csv \u20ac\n", "cmd/run.sh": b"#!/bin/sh\n"}
        got = self.c.sync_resources("s1", skills)
        self.assertTrue(got.complete)
        self.assertEqual(sorted(got.uploaded), sorted(skills))
        self.assertEqual(sorted(got.added), sorted(skills))
        self.assertEqual(got.requests, 1 + 3 + 1)
        self.assertEqual(got.path, "/workspace/.resources")
        self.assertEqual(self.rs.content[sha("# csv \u20ac\n".encode())], "# csv \u20ac\n".encode())

        # Unchanged: one request, nothing uploaded.
        before = len(self.srv.requests)
        got = self.c.sync_resources("s1", skills)
        self.assertEqual((got.requests, got.uploaded, got.unchanged), (1, [], 3))
        self.assertEqual(self.srv.calls()[before:], ["PUT /api/v1/sessions/s1/resources"])

        # One skill changed, one removed: only the changed one goes.
        skills["skills/pdf/SKILL.md"] = b"# pdf v2\n"
        del skills["cmd/run.sh"]
        before = len(self.srv.requests)
        got = self.c.sync_resources("s1", skills)
        self.assertEqual(got.uploaded, ["skills/pdf/SKILL.md"])
        self.assertEqual((got.changed, got.removed, got.unchanged), (["skills/pdf/SKILL.md"], ["cmd/run.sh"], 1))
        puts = [r for r in self.srv.requests[before:] if r.path.startswith("/api/v1/resources/")]
        self.assertEqual([r.body for r in puts], [b"# pdf v2\n"])

        listed = self.c.list_resources("s1")
        self.assertEqual([r.name for r in listed.resources], ["skills/csv/SKILL.md", "skills/pdf/SKILL.md"])
        self.assertEqual(listed.resources[1].sha256, sha(b"# pdf v2\n"))

    def test_same_content_is_sent_once(self):
        got = self.c.sync_resources("s1", {"a": b"same", "b/a": b"same"})
        self.assertTrue(got.complete)
        self.assertEqual(len(got.uploaded), 1)
        self.assertEqual(got.requests, 3)

    def test_content_lost_between_rounds(self):
        self.rs.lose = lambda n: n == 2  # the second manifest finds the content gone
        got = self.c.sync_resources("s1", {"x": b"1"})
        self.assertTrue(got.complete)
        self.assertEqual(got.uploaded, ["x", "x"])
        self.assertEqual(got.requests, 5)

        self.rs.placed.clear()
        self.rs.lose = lambda n: True
        with self.assertRaises(sbx_client.SbxError) as cm:
            self.c.sync_resources("s1", {"y": b"2"})
        self.assertIn("still needs 1", str(cm.exception))

    def test_bad_input(self):
        with self.assertRaises(TypeError):
            self.c.sync_resources("s1", {"x": 3})
        with self.assertRaises(sbx_client.InvalidArgument):
            self.c.sync_resources("..", {})
        self.srv.route("PUT", r"/api/v1/sessions/s2/resources",
                       lambda r: error(400, "invalid_argument", "resource name \"../x\" leaves the resources directory"))
        with self.assertRaises(sbx_client.InvalidArgument) as cm:
            self.c.sync_resources("s2", {"../x": b""})
        self.assertIn("leaves", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
