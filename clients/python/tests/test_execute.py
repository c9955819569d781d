"""execute(): submit, then long-poll the result with backoff."""

import unittest

import sbx_client
from fakeserver import FakeClock, FakeServer, Reply, error, execution_json


class ExecuteTest(unittest.TestCase):
    def serve(self, result):
        """result(request, poll_number) -> Reply for GET .../result."""
        srv = FakeServer()
        self.addCleanup(srv.close)
        polls = {"n": 0}

        def get_result(r, eid):
            polls["n"] += 1
            return result(r, polls["n"])

        srv.route("POST", r"/api/v1/sessions/s1/execute", lambda r: Reply(202, json={"execution_id": "e1", "status": "submitted"}))
        srv.route("POST", r"/api/v1/agents/a1/execute", lambda r: Reply(202, json={"execution_id": "e1", "status": "submitted"}))
        srv.route("GET", r"/api/v1/executions/([^/]+)/result", get_result)
        c = sbx_client.Client(srv.url, timeout=5)
        self.addCleanup(c.close)
        clock = FakeClock()
        c._t._sleep, c._t._clock = clock.sleep, clock
        return c, srv, clock, polls

    def results(self, srv):
        return [r for r in srv.requests if r.path.endswith("/result")]

    def test_submit_then_long_poll(self):
        c, srv, clock, _ = self.serve(lambda r, n: Reply(200, json=execution_json("e1", return_value={"n": 3})))
        x = c.execute(
            "s1", "return {'n': 3}", language="python", event={"k": [1]}, env_vars={"A": "1"}, conversation_id="c1", timeout=2.5
        )
        self.assertEqual((x.status, x.return_value, x.ok, x.done), ("completed", {"n": 3}, True, True))
        self.assertEqual(
            srv.requests[0].json(),
            {
                "code": "return {'n': 3}",
                "language": "python",
                "timeout": 2.5,
                "event": {"k": [1]},
                "env_vars": {"A": "1"},
                "conversation_id": "c1",
            },
        )
        self.assertEqual(srv.requests[0].query, {})  # asynchronous: no wait=true
        poll = self.results(srv)[0]
        self.assertEqual((poll.path, poll.q("wait"), poll.q("timeout")), ("/api/v1/executions/e1/result", "true", "30"))
        self.assertEqual(clock.sleeps, [])

    def test_backoff_when_polls_come_back_early(self):
        # A server that answers at once without the result: the polls are
        # spaced 50 ms, 100 ms, ... up to 2 s.
        c, srv, clock, _ = self.serve(
            lambda r, n: Reply(200, json=execution_json("e1", "running" if n <= 8 else "completed"))
        )
        x = c.execute("s1", "1")
        self.assertEqual(x.status, "completed")
        self.assertEqual(clock.sleeps, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
        self.assertEqual(len(self.results(srv)), 9)

    def test_no_pause_after_a_held_poll(self):
        # The server held each poll for its window: poll again at once.
        def held(r, n):
            clock.advance(float(r.q("timeout")))
            return Reply(200, json=execution_json("e1", "running" if n <= 3 else "completed"))

        c, srv, clock, _ = self.serve(held)
        self.assertEqual(c.execute("s1", "1").status, "completed")
        self.assertEqual(clock.sleeps, [])
        self.assertEqual(len(self.results(srv)), 4)

    def test_transient_errors_are_retried(self):
        replies = {
            1: error(503, "unavailable", "store busy", **{"Retry-After": "3"}),
            2: error(429, "resource_exhausted", "slow down"),  # no Retry-After: backoff
            # A connection closed without an answer: the transport sends a
            # GET again at once on a new connection (3 to 4); when that
            # breaks too, the wait backs off.
            3: Reply(drop=True),
            4: Reply(drop=True),
        }
        c, srv, clock, _ = self.serve(lambda r, n: replies.get(n) or Reply(200, json=execution_json("e1")))
        self.assertEqual(c.execute("s1", "1").status, "completed")
        self.assertEqual(clock.sleeps, [3.0, 0.1, 0.2])
        self.assertEqual(len(self.results(srv)), 5)

    def test_gives_up_after_repeated_failures(self):
        c, srv, clock, _ = self.serve(lambda r, n: error(503, "unavailable", "down"))
        with self.assertRaises(sbx_client.Unavailable) as cm:
            c.execute("s1", "1")
        self.assertEqual(cm.exception.execution_id, "e1")
        self.assertEqual(len(self.results(srv)), 8)

    def test_other_errors_are_not_retried(self):
        c, srv, clock, _ = self.serve(lambda r, n: error(404, "not_found", "execution e1 not found"))
        with self.assertRaises(sbx_client.NotFound):
            c.execute("s1", "1")
        self.assertEqual(len(self.results(srv)), 1)

    def test_wait_timeout(self):
        def held(r, n):
            clock.advance(float(r.q("timeout")))
            return Reply(200, json=execution_json("e1", "running"))

        c, srv, clock, _ = self.serve(held)
        with self.assertRaises(sbx_client.ResultNotReceived) as cm:
            c.execute("s1", "1", wait_timeout=65)
        self.assertEqual(cm.exception.execution_id, "e1")
        self.assertEqual([r.q("timeout") for r in self.results(srv)], ["30", "30", "5"])

    def test_sandbox_unavailable_result(self):
        err = {"type": "SandboxUnavailable", "message": "no sandbox can be had"}
        c, srv, clock, _ = self.serve(lambda r, n: Reply(200, json=execution_json("e1", "failed", error=err)))
        with self.assertRaises(sbx_client.Unavailable) as cm:
            c.execute("s1", "1")
        self.assertEqual((cm.exception.status, cm.exception.execution_id), (503, "e1"))

    def test_failed_execution_is_a_result(self):
        err = {"type": "ZeroDivisionError", "message": "division by zero", "traceback": "Traceback..."}
        c, srv, clock, _ = self.serve(lambda r, n: Reply(200, json=execution_json("e1", "failed", error=err, exit_code=1)))
        x = c.execute("s1", "1/0")
        self.assertEqual((x.status, x.ok, x.error.type, x.exit_code), ("failed", False, "ZeroDivisionError", 1))

    def test_agent_execute(self):
        c, srv, clock, _ = self.serve(lambda r, n: Reply(200, json=execution_json("e1")))
        c.agent_execute("a1", "u1", "1", template_id="python-datascience", conversation_id="c1")
        self.assertEqual(
            srv.requests[0].json(), {"code": "1", "conversation_id": "c1", "user_id": "u1", "template_id": "python-datascience"}
        )
        self.assertEqual(srv.requests[0].path, "/api/v1/agents/a1/execute")


class ExecutionCallsTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.c = sbx_client.Client(self.srv.url, timeout=5)
        self.addCleanup(self.c.close)

    def test_calls(self):
        s = self.srv
        s.route("POST", r"/api/v1/sessions/s1/execute", lambda r: Reply(202, json={"execution_id": "e7", "status": "submitted"}))
        s.route("GET", r"/api/v1/executions/e7", lambda r: Reply(200, json=execution_json("e7", "running")))
        s.route("GET", r"/api/v1/executions/e7/result", lambda r: Reply(200, json=execution_json("e7", "running")))
        s.route("POST", r"/api/v1/executions/e7/cancel", lambda r: Reply(200, json=execution_json("e7", "cancelled")))
        s.route(
            "GET",
            r"/api/v1/sessions/s1/executions",
            lambda r: Reply(200, json={"executions": [execution_json("e7"), execution_json("e6")], "next_page_token": "t2"}),
        )
        self.assertEqual(self.c.submit("s1", "echo hi", language="bash"), "e7")
        self.assertEqual(self.c.get_execution("e7").status, "running")
        self.assertEqual(self.c.get_result("e7").status, "running")
        self.assertEqual(s.requests[-1].query, {})
        self.c.get_result("e7", wait=True, timeout=0.5)
        self.assertEqual((s.requests[-1].q("wait"), s.requests[-1].q("timeout")), ("true", "0.5"))
        self.assertEqual(self.c.cancel("e7").status, "cancelled")
        page = self.c.list_executions("s1", limit=2, page_token="t1")
        self.assertEqual([x.execution_id for x in page.executions], ["e7", "e6"])
        self.assertEqual(page.next_page_token, "t2")
        self.assertEqual((s.requests[-1].q("limit"), s.requests[-1].q("page_token")), ("2", "t1"))


if __name__ == "__main__":
    unittest.main()
