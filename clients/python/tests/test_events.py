"""Events and webhooks: the stream that resumes after a break, pages,
webhook calls, and the receiver's check of a delivery, against a fake
server."""

import hashlib
import hmac
import json
import unittest

import sbx_client
from fakeserver import FakeServer, Reply, error
from sbx_client.sse import SSEParser


def event(i, typ="session.created", sid="s1"):
    return {"id": i, "type": typ, "session_id": sid, "created_at": "2026-11-27T08:00:00Z", "data": {"status": "running"}}


def sse(e):
    return f"id: {e['id']}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()


class EventStreamTest(unittest.TestCase):
    def test_resumes_after_a_break(self):
        srv = FakeServer()
        self.addCleanup(srv.close)
        stream = {"Content-Type": "text/event-stream"}
        replies = [
            # Two events (the second cut across reads), a filter's skip
            # (an id alone), then the connection ends.
            Reply(200, headers=stream, chunks=[sse(event(1)), sse(event(2))[:20], sse(event(2))[20:], b"id: 4\n\n"]),
            error(503, "unavailable", "busy"),  # waited out
            Reply(200, headers=stream, chunks=[sse(event(5, "session.terminated"))]),
        ]
        route = lambda req: replies.pop(0)
        srv.route("GET", r"/api/v1/events", route)
        c = sbx_client.Client(srv.url, timeout=5)
        self.addCleanup(c.close)
        got = []
        for ev in c.events(types=["session.*"], session_id="s1"):
            got.append((ev.id, ev.type, ev.session_id, ev.data["status"]))
            if len(got) == 3:
                break
        self.assertEqual(got, [(1, "session.created", "s1", "running"), (2, "session.created", "s1", "running"), (5, "session.terminated", "s1", "running")])
        # The third connection went on after the skipped 3 and 4.
        self.assertEqual([r.headers.get("last-event-id") for r in srv.requests], ["0", "4", "4"])
        first = srv.requests[0]
        self.assertEqual(first.headers["accept"], "text/event-stream")
        self.assertEqual((first.q("types"), first.q("session_id")), ("session.*", "s1"))

    def test_refusal_is_raised(self):
        srv = FakeServer()
        self.addCleanup(srv.close)
        srv.route("GET", r"/api/v1/events", lambda r: error(401, "unauthenticated", "no key"))
        with sbx_client.Client(srv.url) as c, self.assertRaises(sbx_client.Unauthenticated):
            next(c.events())

    def test_parser_keeps_ids(self):
        p = SSEParser()
        evs = p.feed(b"id: 7\nevent: a\ndata: 1\n\nid: 9\n\n")
        self.assertEqual([(e.name, e.id) for e in evs], [("a", "7")])
        self.assertEqual(p.last_id, "9")


class PagesAndWebhooksTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.c = sbx_client.Client(self.srv.url, timeout=5)
        self.addCleanup(self.c.close)

    def test_pages(self):
        self.srv.route("GET", r"/api/v1/events", lambda r: Reply(json={"events": [event(3)], "next_after": 3}))
        self.srv.route("GET", r"/api/v1/sessions/s1/events", lambda r: Reply(json={"events": [], "next_after": 0}))
        page = self.c.list_events(2, types=["session.created", "execution.*"], limit=10)
        self.assertEqual(([e.id for e in page.events], page.next_after), ([3], 3))
        self.assertEqual(page.events[0].created_at.year, 2026)
        req = self.srv.requests[0]
        self.assertEqual((req.q("after"), req.q("types"), req.q("limit")), ("2", "session.created,execution.*", "10"))
        self.assertEqual(self.c.session_events("s1").events, [])

    def test_webhooks(self):
        hook = {"webhook_id": "wh-1", "url": "https://example.com/h", "events": ["*"], "created_at": "2026-11-27T08:00:00Z"}
        self.srv.route("POST", r"/api/v1/webhooks", lambda r: Reply(201, json={**hook, "secret": "whsec_x", **({"events": r.json()["events"]} if "events" in r.json() else {})}))
        self.srv.route("GET", r"/api/v1/webhooks", lambda r: Reply(json={"webhooks": [hook]}))
        self.srv.route("GET", r"/api/v1/webhooks/wh-1", lambda r: Reply(json=hook))
        self.srv.route("DELETE", r"/api/v1/webhooks/wh-1", lambda r: Reply(204))
        self.srv.route("GET", r"/api/v1/webhooks/wh-1/deliveries", lambda r: Reply(json={"after": 4, "deliveries": [
            {"delivery_id": "wh-1-4", "event_id": 4, "event_type": "session.created", "attempt": 2, "at": "2026-11-27T08:00:01Z",
             "ok": True, "status_code": 200, "duration_ms": 3, "final": True}]}))
        h = self.c.create_webhook("https://example.com/h", events=["session.*"])
        self.assertEqual((h.webhook_id, h.secret, h.events), ("wh-1", "whsec_x", ["session.*"]))
        self.assertEqual(self.srv.requests[0].json(), {"url": "https://example.com/h", "events": ["session.*"]})
        self.assertEqual([w.webhook_id for w in self.c.list_webhooks()], ["wh-1"])
        self.assertEqual(self.c.get_webhook("wh-1").url, "https://example.com/h")
        log = self.c.webhook_deliveries("wh-1")
        self.assertEqual((log.after, log.deliveries[0].attempt, log.deliveries[0].ok), (4, 2, True))
        self.c.delete_webhook("wh-1")
        with self.assertRaises(sbx_client.NotFound):
            self.c.get_webhook("wh-2")


class VerifyTest(unittest.TestCase):
    SECRET = "s3cret-s3cret-s3cret"

    def signed(self, body, ts):
        sig = hmac.new(self.SECRET.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
        return {"X-Sbx-Timestamp": str(ts), "X-Sbx-Signature": "sha256=" + sig}

    def test_known_vector(self):
        # The Go server's webhook.Sign("key", 1700000000, "{}"), worked out
        # apart with openssl.
        h = {"x-sbx-timestamp": "1700000000", "x-sbx-signature": "sha256=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"}
        sbx_client.verify_webhook("key", h, b"{}", now=1700000010)

    def test_refusals(self):
        body = b'{"id":1}'
        good = self.signed(body, 1700000000)
        sbx_client.verify_webhook(self.SECRET, good, body, now=1700000100)
        for name, call in {
            "wrong secret": lambda: sbx_client.verify_webhook("another-secret-000", good, body, now=1700000100),
            "other body": lambda: sbx_client.verify_webhook(self.SECRET, good, body + b" ", now=1700000100),
            "replayed late": lambda: sbx_client.verify_webhook(self.SECRET, good, body, now=1700000000 + 301),
            "no signature": lambda: sbx_client.verify_webhook(self.SECRET, {"X-Sbx-Timestamp": "1700000000"}, body, now=1700000000),
            "no timestamp": lambda: sbx_client.verify_webhook(self.SECRET, {"X-Sbx-Signature": good["X-Sbx-Signature"]}, body),
        }.items():
            with self.subTest(name), self.assertRaises(sbx_client.WebhookVerificationError):
                call()


if __name__ == "__main__":
    unittest.main()
