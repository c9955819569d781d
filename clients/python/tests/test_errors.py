"""Error mapping and the HTTP transport, against a fake server."""

import socket
import unittest

import sbx_client
from sbx_client import errors
from fakeserver import FakeServer, Reply, error, session_json


class ErrorMappingTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.c = sbx_client.Client(self.srv.url, api_key="k1", timeout=5)
        self.addCleanup(self.c.close)

    def test_api_error_body_by_code(self):
        cases = [
            (400, "invalid_argument", sbx_client.InvalidArgument),
            (401, "unauthenticated", sbx_client.Unauthenticated),
            (403, "permission_denied", sbx_client.PermissionDenied),
            (404, "not_found", sbx_client.NotFound),
            (409, "already_exists", sbx_client.Conflict),
            (409, "failed_precondition", sbx_client.Conflict),
            (413, "payload_too_large", sbx_client.PayloadTooLarge),
            (415, "unsupported_media_type", sbx_client.UnsupportedMediaType),
            (422, "unprocessable", sbx_client.Unprocessable),
            (429, "resource_exhausted", sbx_client.ResourceExhausted),
            (500, "internal", sbx_client.InternalError),
            (503, "unavailable", sbx_client.Unavailable),
        ]
        for status, code, cls in cases:
            with self.subTest(code=code):
                self.srv.routes.clear()
                self.srv.route("GET", r"/api/v1/sessions/s1", lambda r, st=status, co=code: error(st, co, f"msg {co}"))
                with self.assertRaises(cls) as cm:
                    self.c.get_session("s1")
                e = cm.exception
                self.assertIsInstance(e, sbx_client.SbxError)
                self.assertEqual((e.status, e.code, e.message), (status, code, f"msg {code}"))
                self.assertEqual(str(e), f"sbx: {status} {code}: msg {code}")

    def test_code_wins_over_status(self):
        # The body's code says the category, whatever the status.
        self.srv.route("GET", r"/api/v1/sessions/s1", lambda r: error(400, "not_found", "odd"))
        with self.assertRaises(sbx_client.NotFound) as cm:
            self.c.get_session("s1")
        self.assertEqual(cm.exception.status, 400)

    def test_unknown_code_is_plain_sbx_error(self):
        self.srv.route("GET", r"/api/v1/sessions/s1", lambda r: error(418, "teapot", "short and stout"))
        with self.assertRaises(sbx_client.SbxError) as cm:
            self.c.get_session("s1")
        self.assertIs(type(cm.exception), sbx_client.SbxError)
        self.assertEqual((cm.exception.status, cm.exception.code), (418, "teapot"))

    def test_body_that_is_not_the_api_error(self):
        cases = [
            (416, b"invalid range: failed to overlap", "text/plain", sbx_client.InvalidArgument, "invalid range: failed to overlap"),
            (502, b"", "text/html", sbx_client.Unavailable, "Bad Gateway"),
            (404, b'{"message":"not ours"}', "application/json", sbx_client.NotFound, '{"message":"not ours"}'),
            (500, b"<html>" + b"x" * 500, "text/html", sbx_client.InternalError, None),
        ]
        for status, body, ctype, cls, msg in cases:
            with self.subTest(status=status):
                self.srv.routes.clear()
                self.srv.route(
                    "GET", r"/api/v1/sessions/s1", lambda r, s=status, b=body, t=ctype: Reply(s, body=b, headers={"Content-Type": t})
                )
                with self.assertRaises(cls) as cm:
                    self.c.get_session("s1")
                self.assertEqual(cm.exception.status, status)
                if msg is not None:
                    self.assertEqual(cm.exception.message, msg)
                else:
                    self.assertTrue(cm.exception.message.endswith("..."), cm.exception.message)
                    self.assertLessEqual(len(cm.exception.message), 203)

    def test_retry_after(self):
        self.srv.route("GET", r"/api/v1/sessions/s1", lambda r: error(503, "unavailable", "no sandbox", **{"Retry-After": "5"}))
        with self.assertRaises(sbx_client.Unavailable) as cm:
            self.c.get_session("s1")
        self.assertEqual(cm.exception.retry_after, 5.0)
        self.assertIsNone(errors.parse_retry_after(None))
        self.assertIsNone(errors.parse_retry_after("soon"))
        self.assertEqual(errors.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), 0.0)  # in the past

    def test_sends_key_and_json(self):
        self.srv.route("POST", r"/api/v1/sessions", lambda r: Reply(201, json=session_json("s9")))
        s = self.c.create_session("s9", template_id="python", metadata={"user_id": "u"})
        req = self.srv.requests[-1]
        self.assertEqual(req.headers["authorization"], "Bearer k1")
        self.assertEqual(req.headers["content-type"], "application/json")
        self.assertEqual(req.json(), {"session_id": "s9", "template_id": "python", "metadata": {"user_id": "u"}})
        self.assertEqual(s.session_id, "s9")
        self.assertEqual(s.created_at.microsecond, 123456)
        self.assertEqual(s.created_at.utcoffset().total_seconds(), 0)
        self.assertEqual(s.resources.memory, 512)
        self.assertEqual(s.raw["ttl"], 86400)

    def test_refused_before_any_request(self):
        for call in (
            lambda: self.c.get_session(""),
            lambda: self.c.get_session(".."),
            lambda: self.c.get_result("."),
            lambda: self.c.download("s1", "../etc/passwd"),
            lambda: self.c.download("s1", "a//b"),
            lambda: self.c.download("s1", "/"),
            lambda: self.c.download("s1", "x", offset=-1),
            lambda: self.c.download("s1", "x", length=0),
            lambda: self.c.upload("s1", []),
            lambda: self.c.upload("s1", ("a\nb", b"x")),
        ):
            with self.assertRaises(sbx_client.InvalidArgument):
                call()
        self.assertEqual(self.srv.requests, [])

    def test_ids_and_paths_are_escaped(self):
        self.srv.route("GET", r"/api/v1/sessions/(.+)/files/(.+)", lambda r, s, p: Reply(200, body=b"ok"))
        self.c.download("a b", "dir/my file#1.csv")
        self.assertEqual(self.srv.requests[-1].raw_path, "/api/v1/sessions/a%20b/files/dir/my%20file%231.csv")

    def test_readyz(self):
        health = {"status": "unavailable", "checks": {"store": "ok", "runtime": "no runc"}}
        self.srv.route("GET", r"/readyz", lambda r: Reply(503, json=health))
        with self.assertRaises(sbx_client.Unavailable) as cm:
            self.c.readyz()
        self.assertIn("runtime: no runc", cm.exception.message)
        self.assertEqual(cm.exception.health.checks["runtime"], "no runc")
        self.srv.route("GET", r"/healthz", lambda r: Reply(200, json={"status": "ok"}))
        self.assertEqual(self.c.health().status, "ok")


class TransportTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.c = sbx_client.Client(self.srv.url, timeout=5)
        self.addCleanup(self.c.close)

    def test_connection_refused(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        c = sbx_client.Client(f"http://127.0.0.1:{port}", timeout=2)
        with self.assertRaises(sbx_client.TransportError) as cm:
            c.health()
        self.assertIsNone(cm.exception.status)
        self.assertIsInstance(cm.exception.__cause__, OSError)

    def test_connections_are_reused(self):
        self.srv.route("GET", r"/api/v1/sessions/(.+)", lambda r, sid: Reply(200, json=session_json(sid)))
        for i in range(5):
            self.c.get_session(f"s{i}")
        self.assertEqual({r.conn_id for r in self.srv.requests}, {1})

    def test_stale_connection_retried_for_get_only(self):
        n = {"get": 0, "post": 0}

        def get(r, sid):
            n["get"] += 1
            # The second request arrives on the kept connection: close it
            # without an answer, as a server does with an idle connection.
            return Reply(drop=True) if n["get"] == 2 else Reply(200, json=session_json(sid))

        def post(r):
            n["post"] += 1
            return Reply(drop=True) if n["post"] == 1 else Reply(202, json={"execution_id": "e1", "status": "submitted"})

        self.srv.route("GET", r"/api/v1/sessions/([^/]+)", get)
        self.srv.route("POST", r"/api/v1/sessions/s1/execute", post)
        self.c.get_session("s1")
        self.assertEqual(self.c.get_session("s2").session_id, "s2")  # retried on a new connection
        self.assertEqual(n["get"], 3)
        # A POST that may have been acted on is never sent twice.
        with self.assertRaises(sbx_client.TransportError):
            self.c.submit("s1", "1")
        self.assertEqual(n["post"], 1)

    def test_error_answer_keeps_connection(self):
        self.srv.route("GET", r"/api/v1/sessions/nope", lambda r: error(404, "not_found", "no"))
        self.srv.route("GET", r"/api/v1/sessions/s1", lambda r: Reply(200, json=session_json("s1")))
        with self.assertRaises(sbx_client.NotFound):
            self.c.get_session("nope")
        self.c.get_session("s1")
        self.assertEqual({r.conn_id for r in self.srv.requests}, {1})

    def test_base_url_with_path(self):
        self.srv.route("GET", r"/prefix/api/v1/sessions/s1", lambda r: Reply(200, json=session_json("s1")))
        c = sbx_client.Client(self.srv.url + "/prefix/", timeout=5)
        self.addCleanup(c.close)
        self.assertEqual(c.get_session("s1").session_id, "s1")
        with self.assertRaises(ValueError):
            sbx_client.Client("localhost:7070")


if __name__ == "__main__":
    unittest.main()
