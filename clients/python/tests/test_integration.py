"""Integration tests against a real sbx server: SBX_URL (and SBX_API_KEY if
the server wants one). Skipped when SBX_URL is not set.

internal/server/python_integration_test.go runs them against a server with
real runc sandboxes; by hand:

    cd clients/python && SBX_URL=http://127.0.0.1:7070 python3 -m unittest discover -s tests -v
"""

import base64
import hashlib
import io
import json
import os
import secrets
import struct
import threading
import time
import unittest
import urllib.request
import zlib

import sbx_client

URL = os.environ.get("SBX_URL")
KEY = os.environ.get("SBX_API_KEY") or None
SKIP = "SBX_URL is not set: no sbx server to test against"


def client():
    return sbx_client.Client(URL, api_key=KEY, timeout=120)


def uid(prefix="py"):
    """A user id of its own per test, so runs against a shared server do not
    meet."""
    return f"{prefix}{secrets.token_hex(4)}"


def make_csv():
    """100 rows of city,temp; every tenth (3, 13, ...) has no temp."""
    rows = ["city,temp"]
    for i in range(100):
        rows.append("broken," if i % 10 == 3 else f"c{i % 7},{10 + i % 20}")
    return "\n".join(rows) + "\n"


def make_pdf(n):
    """A PDF of n pages, page i saying "Page i of the quarterly report" in
    Helvetica (internal/server/integration_test.go's makePDF)."""
    b = bytearray(b"%PDF-1.4\n")
    offsets = []

    def obj(body):
        offsets.append(len(b))
        b.extend(f"{len(offsets)} 0 obj\n{body}\nendobj\n".encode())

    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    obj("<< /Type /Catalog /Pages 2 0 R >>")
    obj(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>")
    obj("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i in range(n):
        stream = f"BT /F1 18 Tf 72 700 Td (Page {i + 1} of the quarterly report) Tj ET"
        obj(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>"
        )
        obj(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    xref = len(b)
    b.extend(f"xref\n0 {len(offsets) + 1}\n0000000000 65535 f \n".encode())
    for off in offsets:
        b.extend(f"{off:010d} 00000 n \n".encode())
    b.extend(f"trailer\n<< /Size {len(offsets) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return bytes(b)


def png_size(data):
    """(width, height) of a PNG, checking its signature, its IHDR chunk's
    CRC and that it ends with IEND; raises AssertionError otherwise."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    length, ctype = struct.unpack(">I4s", data[8:16])
    assert ctype == b"IHDR" and length == 13, ctype
    ihdr = data[16 : 16 + length]
    (crc,) = struct.unpack(">I", data[16 + length : 20 + length])
    assert zlib.crc32(b"IHDR" + ihdr) == crc, "IHDR CRC"
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82", data[-12:]
    return struct.unpack(">II", ihdr[:8])


def delete_quietly(c, session_id):
    try:
        c.delete_session(session_id)
    except sbx_client.NotFound:
        pass


def delete_quietly_webhook(c, webhook_id):
    try:
        c.delete_webhook(webhook_id)
    except sbx_client.NotFound:
        pass


# Code an agent would write to read pages of the PDF (python-datascience has
# no PDF library, and these PDFs are plain): the page tree in order, each
# page's text operators.
READ_PAGES = r"""
import re
def handler(event):
    data = open("/workspace/uploads/temparea/report.pdf", "rb").read()
    objs = {int(m.group(1)): m.group(2) for m in re.finditer(rb"(\d+) 0 obj\s*(.*?)\s*endobj", data, re.S)}
    root = int(re.search(rb"/Root (\d+) 0 R", data).group(1))
    pages = int(re.search(rb"/Pages (\d+) 0 R", objs[root]).group(1))
    kids = [int(k) for k in re.findall(rb"(\d+) 0 R", re.search(rb"/Kids \[(.*?)\]", objs[pages], re.S).group(1))]
    out = []
    for k in kids[event["first"] - 1 : event["last"]]:
        contents = int(re.search(rb"/Contents (\d+) 0 R", objs[k]).group(1))
        stream = re.search(rb"stream\r?\n(.*?)\r?\nendstream", objs[contents], re.S).group(1)
        out.append(" ".join(s.decode("latin-1") for s in re.findall(rb"\((.*?)\)\s*Tj", stream)))
    return out
"""


@unittest.skipUnless(URL, SKIP)
class AgentWorkloadsTest(unittest.TestCase):
    """The two workloads of docs/REQUIREMENTS.md, driven as an agent drives
    them: one user's agent session (ensure_session), conversations c1 and
    c2."""

    @classmethod
    def setUpClass(cls):
        cls.c = client()
        cls.user, cls.agent = uid(), "analyst"
        cls.sid = cls.c.ensure_session(cls.user, cls.agent, create={"template_id": "python-datascience"})

    @classmethod
    def tearDownClass(cls):
        cls.c.delete_session(cls.sid)
        cls.c.close()

    def run_ok(self, code, **kw):
        x = self.c.execute(self.sid, code, **kw)
        self.assertEqual(x.status, "completed", f"{x.error}\nstdout: {x.stdout}\nstderr: {x.stderr}")
        return x

    def test_a_data_analysis(self):
        c, sid = self.c, self.sid
        self.assertEqual(sid, f"sb-session-{self.user}-analyst")
        self.assertEqual(c.get_session(sid).metadata, {"user_id": self.user, "agent_id": "analyst"})
        up = c.upload(sid, ("data.csv", make_csv()), conversation_id="c1")
        self.assertEqual(up[0].sandbox_path, "/workspace/uploads/temparea/data.csv")
        self.assertEqual(up[0].conversation_id, "c1")

        r1 = self.run_ok(
            """
import pandas as pd
df = pd.read_csv("/workspace/uploads/temparea/data.csv")
clean = df.dropna()
clean.to_csv("/workspace/data_clean.csv", index=False)
return {"rows": len(df), "clean_rows": len(clean)}
""",
            conversation_id="c1",
        )
        self.assertEqual(r1.return_value, {"rows": 100, "clean_rows": 90})
        self.assertIn("data_clean.csv", r1.artifacts)

        r2 = self.run_ok(
            """
import pandas as pd
df = pd.read_csv("/workspace/data_clean.csv")
s = df["temp"].describe()
return {"mean": round(float(s["mean"]), 3), "max": float(s["max"]), "count": int(s["count"])}
""",
            conversation_id="c1",
        )
        self.assertEqual((r2.return_value["count"], r2.return_value["max"]), (90, 29.0))

        r3 = self.run_ok(
            """
import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv("/workspace/data_clean.csv")
df.groupby("city")["temp"].mean().plot(kind="bar")
plt.savefig("/workspace/chart.png")
print("saved")
""",
            conversation_id="c1",
        )
        self.assertIn("chart.png", r3.artifacts)
        self.assertEqual(r3.stdout.strip(), "saved")

        png = c.download(sid, "chart.png")
        w, h = png_size(png)
        self.assertGreater(w * h, 0)
        buf = io.BytesIO()
        self.assertEqual(c.download_to(sid, "chart.png", buf), len(png))
        self.assertEqual(buf.getvalue(), png)
        hist = c.list_executions(sid, limit=3)
        self.assertEqual([x.execution_id for x in hist.executions], [r3.execution_id, r2.execution_id, r1.execution_id])

    def test_b_question_answering(self):
        c, sid = self.c, self.sid
        pdf = make_pdf(20)
        up = c.upload(sid, ("report.pdf", pdf, "application/pdf"), conversation_id="c2", subdir="temparea")
        self.assertEqual((up[0].path, up[0].size), ("uploads/c2/temparea/report.pdf", len(pdf)))

        # The read_file tool, in two parts, as a model reads a large file.
        half = len(pdf) // 2
        p1 = c.invoke_tool("read_file", self.user, self.agent, {"path": up[0].path, "offset": 0, "length": half}, conversation_id="c2")
        self.assertFalse(p1.is_error, p1.content)
        self.assertEqual(p1.session_id, sid)
        self.assertEqual((p1.data["next_offset"], p1.data["eof"]), (half, False))
        rest = {"path": up[0].path, "offset": p1.data["next_offset"], "length": 1 << 20}
        p2 = c.invoke_tool("read_file", self.user, self.agent, rest, conversation_id="c2")
        self.assertTrue(p2.data["eof"], p2.content)
        self.assertEqual(p2.data["next_offset"], len(pdf))
        got = b"".join(
            p.data["content"].encode() if p.data["encoding"] == "utf-8" else base64.b64decode(p.data["content"]) for p in (p1, p2)
        )
        self.assertEqual(got, pdf)
        self.assertIn("Page 20 of the quarterly report", p2.content)

        # Code for c2 reads the pages from its temp area, 1-10 then 11-20.
        for first, last in ((1, 10), (11, 20)):
            x = self.c.execute(sid, READ_PAGES, event={"first": first, "last": last}, conversation_id="c2")
            self.assertEqual(x.status, "completed", f"{x.error}")
            self.assertEqual(x.return_value, [f"Page {i} of the quarterly report" for i in range(first, last + 1)])

        # Code for c1 cannot see c2's files: not in its view, not under
        # another name, not anywhere in the workspace.
        x = self.run_ok(
            """
import os
seen = sorted(os.listdir("/workspace/uploads"))
mine = sorted(os.listdir("/workspace/uploads/temparea"))
found = [os.path.join(d, f) for d, _, fs in os.walk("/workspace") for f in fs if f == "report.pdf"]
try:
    open("/workspace/uploads/c2/temparea/report.pdf", "rb")
    leaked = True
except OSError:
    leaked = False
return {"seen": seen, "mine": mine, "found": found, "leaked": leaked}
""",
            conversation_id="c1",
        )
        v = x.return_value
        self.assertEqual(v["seen"], ["temparea"])
        self.assertNotIn("report.pdf", v["mine"])
        self.assertEqual((v["found"], v["leaked"]), ([], False))
        self.assertNotIn("report.pdf", [f.name for f in c.list_files(sid, conversation_id="c1").files])
        self.assertEqual([f.name for f in c.list_files(sid, conversation_id="c2").files], ["report.pdf"])

        # The conversation ends: its files go at once.
        c.delete_conversation(sid, "c2")
        self.assertEqual(c.list_files(sid, conversation_id="c2").files, [])
        x = self.run_ok("import os\nreturn os.listdir('/workspace/uploads/temparea')", conversation_id="c2")
        self.assertEqual(x.return_value, [])


@unittest.skipUnless(URL, SKIP)
class ExecutionModesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = client()
        cls.sid = cls.c.ensure_session(uid(), "modes")

    @classmethod
    def tearDownClass(cls):
        cls.c.delete_session(cls.sid)
        cls.c.close()

    def test_stream(self):
        got = []
        lock = threading.Lock()

        def on_output(stream, text):
            with lock:
                got.append((stream, text))

        x = self.c.execute_stream(
            self.sid,
            "import sys, time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.05)\n"
            "print('oops', file=sys.stderr, flush=True)\nreturn 7",
            on_output,
        )
        self.assertEqual((x.status, x.return_value), ("completed", 7))
        self.assertEqual(got[0][0], "stdout")
        self.assertEqual("".join(t for s, t in got if s == "stdout"), "tick 0\ntick 1\ntick 2\n")
        self.assertEqual("".join(t for s, t in got if s == "stderr"), "oops\n")
        self.assertEqual(x.stdout, "tick 0\ntick 1\ntick 2\n")

    def test_async_submit_and_get_result(self):
        eid = self.c.submit(self.sid, "import time\ntime.sleep(0.5)\nreturn 5")
        self.assertIn(self.c.get_execution(eid).status, ("submitted", "pending", "running", "completed"))
        x = self.c.get_result(eid, wait=True, timeout=60)
        self.assertEqual((x.execution_id, x.status, x.return_value), (eid, "completed", 5))
        self.assertIsNotNone(x.finished_at)
        self.assertGreaterEqual(x.duration_ms, 400)
        self.assertEqual(self.c.wait_result(eid).return_value, 5)

    def test_cancel(self):
        eid = self.c.submit(self.sid, "import time\ntime.sleep(60)")
        deadline = time.monotonic() + 60
        while self.c.get_execution(eid).status != "running":
            self.assertLess(time.monotonic(), deadline, "the execution never ran")
            time.sleep(0.01)
        self.assertEqual(self.c.cancel(eid).status, "cancelled")
        self.assertEqual(self.c.wait_result(eid, timeout=30).status, "cancelled")

    def test_results_of_every_kind(self):
        x = self.c.execute(self.sid, "1/0")
        self.assertEqual((x.status, x.error.type), ("failed", "ZeroDivisionError"))
        self.assertIn("ZeroDivisionError", x.error.traceback)
        x = self.c.execute(self.sid, "import time\ntime.sleep(30)", timeout=0.5)
        self.assertEqual(x.status, "timeout")
        x = self.c.execute(self.sid, "echo $((6*7)); exit 3", language="bash")
        self.assertEqual((x.status, x.stdout, x.exit_code), ("failed", "42\n", 3))
        x = self.c.execute(self.sid, "def handler(event):\n    return event['n'] * 2", event={"n": 21})
        self.assertEqual(x.return_value, 42)


@unittest.skipUnless(URL, SKIP)
class AgentEndpointsTest(unittest.TestCase):
    def setUp(self):
        self.c = client()
        self.addCleanup(self.c.close)
        self.user = uid()
        self.sid = sbx_client.agent_session_id(self.user, "helper")
        self.addCleanup(delete_quietly, self.c, self.sid)

    def test_agent_calls(self):
        c, user = self.c, self.user
        with self.assertRaises(sbx_client.NotFound):
            c.agent_list_files("helper", user)  # no session before the first execute or upload
        up = c.agent_upload("helper", user, ("q.txt", "what is 6*7?"), conversation_id="c1")
        self.assertEqual(up[0].sandbox_path, "/workspace/uploads/temparea/q.txt")
        x = c.agent_execute(
            "helper",
            user,
            "open('/workspace/answer.txt', 'w').write('42 is the answer')\nreturn open('/workspace/uploads/temparea/q.txt').read()",
            conversation_id="c1",
        )
        self.assertEqual((x.status, x.return_value, x.session_id), ("completed", "what is 6*7?", self.sid))
        self.assertEqual(c.ensure_session(user, "helper"), self.sid)  # the agent endpoints' session is ensure_session's
        names = [f.name for f in c.agent_list_files("helper", user).files]
        self.assertIn("answer.txt", names)
        self.assertEqual([f.name for f in c.agent_list_files("helper", user, conversation_id="c1").files], ["q.txt"])
        self.assertEqual(c.agent_download("helper", user, "q.txt", conversation_id="c1"), b"what is 6*7?")
        self.assertEqual(c.agent_download("helper", user, "answer.txt", offset=3, length=2), b"is")
        buf = io.BytesIO()
        self.assertEqual(c.agent_download_to("helper", user, "answer.txt", buf), 16)

    def test_tools(self):
        c, user = self.c, self.user
        tools = c.list_tools()
        self.assertEqual(sorted(t.name for t in tools), ["execute_code", "list_files", "read_file", "run_bash", "upload_file"])
        for t in tools:
            self.assertEqual(t.raw["type"], "function")
            self.assertEqual(t.parameters["type"], "object")
        r = c.invoke_tool("upload_file", user, "helper", {"path": "notes/a.txt", "content": "alpha\nbeta\n"})
        self.assertFalse(r.is_error, r.content)
        self.assertEqual(r.session_id, self.sid)
        r = c.invoke_tool("execute_code", user, "helper", {"code": "print('hi')\nreturn len(open('/workspace/notes/a.txt').read())"})
        self.assertEqual((r.is_error, r.content), (False, "stdout:\nhi\nresult: 11\n"))
        self.assertEqual(r.data["status"], "completed")
        r = c.invoke_tool("run_bash", user, "helper", json.dumps({"command": "cat notes/a.txt; exit 3"}))
        self.assertTrue(r.is_error)
        self.assertEqual(r.content, "stdout:\nalpha\nbeta\nexit code: 3\n")
        r = c.invoke_tool("list_files", user, "helper", {"path": "notes"})
        self.assertEqual([f["path"] for f in r.data["files"]], ["notes/a.txt"])
        r = c.invoke_tool("execute_code", user, "helper", {"code": "1/0"})
        self.assertTrue(r.is_error)
        self.assertIn("ZeroDivisionError", r.content)
        r = c.invoke_tool("read_file", user, "helper", {"path": "no/such.txt"})
        self.assertTrue(r.is_error)


@unittest.skipUnless(URL, SKIP)
class FilesTest(unittest.TestCase):
    def setUp(self):
        self.c = client()
        self.addCleanup(self.c.close)
        self.sid = self.c.create_session(uid("py-files-"), template_id="python").session_id
        self.addCleanup(self.c.delete_session, self.sid)

    def test_round_trip(self):
        c, sid = self.c, self.sid
        blob = bytes(range(256)) * 400
        up = c.upload(sid, [("a.txt", "hello"), ("b.bin", io.BytesIO(blob))], path="dir/")
        self.assertEqual([(u.path, u.size) for u in up], [("dir/a.txt", 5), ("dir/b.bin", len(blob))])
        self.assertEqual(up[1].sha256, hashlib.sha256(blob).hexdigest())
        self.assertEqual(sorted(f.path for f in c.list_files(sid, "dir").files), ["dir/a.txt", "dir/b.bin"])
        top = c.list_files(sid, recursive=True)
        self.assertIn("dir/b.bin", [f.path for f in top.files])
        self.assertEqual(c.download(sid, "dir/b.bin"), blob)
        self.assertEqual(c.download(sid, "/dir/b.bin", offset=1000, length=300), blob[1000:1300])
        self.assertEqual(c.download(sid, "dir/b.bin", offset=len(blob) - 10), blob[-10:])
        buf = io.BytesIO()
        self.assertEqual(c.download_to(sid, "dir/b.bin", buf, offset=5), len(blob) - 5)
        self.assertEqual(buf.getvalue(), blob[5:])
        # The code sees the files, and its files come back.
        x = c.execute(sid, "return open('/workspace/dir/a.txt').read() + ' world'")
        self.assertEqual(x.return_value, "hello world")
        p = c.presign(sid, "dir/b.bin", expires_in=120)
        self.assertTrue(p.url.startswith("http"), p.url)
        with urllib.request.urlopen(p.url, timeout=30) as resp:  # no API key
            self.assertEqual(resp.read(), blob)
        c.delete_file(sid, "dir/a.txt")
        with self.assertRaises(sbx_client.NotFound):
            c.download(sid, "dir/a.txt")
        with self.assertRaises(sbx_client.SbxError):
            c.delete_file(sid, "dir")  # not empty
        c.delete_file(sid, "dir", recursive=True)
        self.assertNotIn("dir", [f.name for f in c.list_files(sid).files])

    def test_conversation_files(self):
        c, sid = self.c, self.sid
        c.upload(sid, ("note.txt", "for c9"), conversation_id="c9")
        self.assertEqual([f.name for f in c.list_files(sid, conversation_id="c9").files], ["note.txt"])
        x = c.execute(sid, "return open('/workspace/uploads/temparea/note.txt').read()", conversation_id="c9")
        self.assertEqual(x.return_value, "for c9")
        c.delete_conversation(sid, "c9")
        self.assertEqual(c.list_files(sid, conversation_id="c9").files, [])


@unittest.skipUnless(URL, SKIP)
class ResourcesTest(unittest.TestCase):
    """R-34 as an agent platform uses it: an agent's skills kept in step
    with its session; what did not change never goes over the wire again."""

    def test_sync(self):
        c = client()
        self.addCleanup(c.close)
        user = uid("py-res-")
        sid = c.ensure_session(user, "skilled")
        self.addCleanup(delete_quietly, c, sid)
        skills = {
            "skills/pdf/SKILL.md": b"# Reading PDFs\nUse pypdf.\n",
            "skills/csv/SKILL.md": "# CSV \u20ac\nUse pandas.\n",
            "commands/report.sh": b"#!/bin/sh\necho report\n",
        }
        got = c.sync_resources(sid, skills)
        self.assertTrue(got.complete)
        self.assertEqual(sorted(got.uploaded), sorted(skills))
        self.assertEqual(got.path, "/workspace/.resources")

        # Unchanged: one request, nothing transferred.
        got = c.sync_resources(sid, skills)
        self.assertEqual((got.requests, got.uploaded, got.unchanged, got.added), (1, [], 3, []))

        # A changed skill transfers only itself; a dropped one goes away.
        skills["skills/pdf/SKILL.md"] = b"# Reading PDFs\nUse pypdf, page by page.\n"
        del skills["commands/report.sh"]
        got = c.sync_resources(sid, skills)
        self.assertEqual(got.uploaded, ["skills/pdf/SKILL.md"])
        self.assertEqual((got.changed, got.removed), (["skills/pdf/SKILL.md"], ["commands/report.sh"]))
        self.assertEqual([r.name for r in c.list_resources(sid).resources], sorted(skills))

        # The sandbox sees them, read-only.
        x = c.execute(sid, (
            "import os\n"
            "base = '/workspace/.resources'\n"
            "pdf = open(base + '/skills/pdf/SKILL.md').read()\n"
            "try:\n"
            "    open(base + '/skills/pdf/SKILL.md', 'w').write('x')\n"
            "    wrote = True\n"
            "except OSError:\n"
            "    wrote = False\n"
            "return [pdf, os.path.exists(base + '/commands/report.sh'), wrote]"
        ))
        self.assertEqual(x.status, "completed", x.error)
        self.assertEqual(x.return_value, ["# Reading PDFs\nUse pypdf, page by page.\n", False, False])

        # Another session with the same skills uploads nothing: content is
        # stored once.
        other = c.ensure_session(user, "skilled-too")
        self.addCleanup(delete_quietly, c, other)
        got = c.sync_resources(other, skills)
        self.assertTrue(got.complete)
        self.assertEqual((got.uploaded, got.requests), ([], 1))


@unittest.skipUnless(URL, SKIP)
class SessionsTest(unittest.TestCase):
    def test_lifecycle_and_snapshots(self):
        c = client()
        self.addCleanup(c.close)
        user = uid()
        sid = f"py-life-{user}"
        s = c.create_session(sid, template_id="python", metadata={"user_id": user}, timeout=3600)
        self.addCleanup(c.delete_session, sid)
        self.assertEqual((s.session_id, s.status, s.template_id, s.ttl), (sid, "running", "python", 3600))
        self.assertEqual(c.create_session(sid).session_id, sid)  # idempotent
        self.assertEqual([x.session_id for x in c.list_sessions(user_id=user).sessions], [sid])
        self.assertEqual(c.list_sessions(metadata={"user_id": user}, status="running").sessions[0].session_id, sid)
        c.execute(sid, "open('/workspace/f.txt', 'w').write('v1')")

        self.assertEqual(c.pause_session(sid).status, "paused")
        self.assertEqual(c.execute(sid, "return open('/workspace/f.txt').read()").return_value, "v1")  # resumes it
        self.assertEqual(c.get_session(sid).status, "running")
        before = c.get_session(sid).expires_at
        self.assertGreater(c.keepalive_session(sid, timeout=7200).expires_at, before)
        self.assertEqual(c.hibernate_session(sid).status, "hibernated")
        self.assertEqual(c.resume_session(sid).status, "running")

        snap = c.create_snapshot(sid)
        self.assertGreaterEqual(snap.files, 1)
        self.assertIn(snap.snapshot_id, [x.snapshot_id for x in c.list_snapshots(sid)])
        self.assertEqual(c.get_snapshot(sid, snap.snapshot_id).bytes, snap.bytes)
        c.execute(sid, "open('/workspace/f.txt', 'w').write('v2')")
        self.assertEqual(c.restore_snapshot(sid, snap.snapshot_id).status, "running")
        self.assertEqual(c.execute(sid, "return open('/workspace/f.txt').read()").return_value, "v1")
        c.delete_snapshot(sid, snap.snapshot_id)
        with self.assertRaises(sbx_client.NotFound):
            c.get_snapshot(sid, snap.snapshot_id)

        c.delete_session(sid)
        c.delete_session(sid)  # idempotent
        try:
            self.assertEqual(c.get_session(sid).status, "terminated")
        except sbx_client.NotFound:
            pass

    def test_events_and_webhooks(self):
        c = client()
        self.addCleanup(c.close)
        sid = f"py-ev-{uid()}"
        c.create_session(sid, template_id="python")
        self.addCleanup(delete_quietly, c, sid)
        c.pause_session(sid)
        c.delete_session(sid)
        want = ["session.created", "session.paused", "session.terminated"]
        self.assertEqual([e.type for e in c.session_events(sid).events], want)
        page = c.list_events(session_id=sid, types=["session.paused"])
        self.assertEqual([(e.type, e.data["status"], e.data["reason"]) for e in page.events], [("session.paused", "paused", "request")])
        got = []
        for ev in c.events(session_id=sid):
            got.append(ev)
            if len(got) == len(want):
                break
        self.assertEqual([e.type for e in got], want)
        self.assertEqual(sorted({e.session_id for e in got}), [sid])

        h = c.create_webhook("https://hooks.example.com/sbx", events=["session.*"])
        self.addCleanup(delete_quietly_webhook, c, h.webhook_id)
        self.assertTrue(h.secret)
        self.assertIn(h.webhook_id, [w.webhook_id for w in c.list_webhooks()])
        self.assertEqual((c.get_webhook(h.webhook_id).events, c.get_webhook(h.webhook_id).secret), (["session.*"], ""))
        self.assertIsInstance(c.webhook_deliveries(h.webhook_id).deliveries, list)
        c.delete_webhook(h.webhook_id)
        with self.assertRaises(sbx_client.NotFound):
            c.get_webhook(h.webhook_id)
        with self.assertRaises(sbx_client.InvalidArgument):
            c.create_webhook("http://127.0.0.1:7070/api/v1/sessions")  # the server's own port

    def test_health(self):
        with client() as c:
            self.assertEqual(c.health().status, "ok")
            self.assertEqual(c.readyz().status, "ok")


@unittest.skipUnless(URL, SKIP)
class ErrorsTest(unittest.TestCase):
    def setUp(self):
        self.c = client()
        self.addCleanup(self.c.close)

    def test_not_found(self):
        c = self.c
        with self.assertRaises(sbx_client.NotFound) as cm:
            c.get_session(uid("py-nope-"))
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        self.assertTrue(cm.exception.message)
        for call in (
            lambda: c.execute(uid("py-nope-"), "1"),
            lambda: c.get_result("exec-nope"),
            lambda: c.cancel("exec-nope"),
            lambda: c.invoke_tool("no_such_tool", "u", "a", {}),
        ):
            with self.assertRaises(sbx_client.NotFound):
                call()

    def test_bad_input(self):
        c = self.c
        with self.assertRaises(sbx_client.InvalidArgument) as cm:
            c.create_session("bad id!")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_argument"))
        limits = {"max_file_size": 1, "max_file_size_unit": "KB", "allowed_file_types": [".txt"]}
        sid = c.create_session(uid("py-err-"), template_id="python", file_upload_config=limits).session_id
        self.addCleanup(c.delete_session, sid)
        user = uid()
        self.addCleanup(delete_quietly, c, sbx_client.agent_session_id(user, "a1"))  # invoke_tool makes it first
        for call in (
            lambda: c.execute(sid, "1", language="cobol"),
            lambda: c.create_session(uid("py-err-"), resources={"memory": 1}),
            lambda: c.invoke_tool("read_file", user, "a1", {"path": "x", "bogus": 1}),
            lambda: c.agent_execute("a1", "bad/user", "1"),
        ):
            with self.assertRaises(sbx_client.InvalidArgument) as cm:
                call()
            self.assertEqual(cm.exception.status, 400, cm.exception)
        with self.assertRaises(sbx_client.PayloadTooLarge) as cm:
            c.upload(sid, ("big.txt", io.BytesIO(b"x" * (4 << 20))))
        self.assertIn("1 KB", cm.exception.message)
        with self.assertRaises(sbx_client.UnsupportedMediaType):
            c.upload(sid, ("tool.exe", b"MZ"))
        c.upload(sid, ("small.txt", b"ok"))
        with self.assertRaises(sbx_client.InvalidArgument) as cm:
            c.download(sid, "small.txt", offset=10)
        self.assertEqual(cm.exception.status, 416)
        with self.assertRaises(sbx_client.NotFound):
            c.download(sid, "missing.txt")



@unittest.skipUnless(URL, SKIP)
class MetricsTest(unittest.TestCase):
    def test_session_metrics(self):
        c = client()
        self.addCleanup(c.close)
        sid = c.create_session(uid("py-metrics-"), template_id="python").session_id
        self.addCleanup(delete_quietly, c, sid)
        m = c.session_metrics(sid)
        self.assertEqual((m.session_id, m.sandbox, m.current, m.samples), (sid, "none", None, []))
        c.execute(sid, "open('/workspace/f.bin', 'wb').write(b'x' * (1 << 20))")
        m = c.session_metrics(sid)
        self.assertEqual(m.sandbox, "running")
        self.assertGreater(m.current.memory_used_bytes, 0)
        self.assertGreater(m.current.memory_limit_bytes, 0)
        self.assertGreater(m.current.cpu_count, 0)
        self.assertGreaterEqual(m.current.cpu_used_pct, 0)
        self.assertGreaterEqual(m.current.disk_used_bytes, 1 << 20)
        self.assertIsInstance(c.session_metrics(sid, since=m.current.timestamp).samples, list)
        with self.assertRaises(sbx_client.NotFound):
            c.session_metrics(uid("py-metrics-none-"))


if __name__ == "__main__":
    unittest.main()
