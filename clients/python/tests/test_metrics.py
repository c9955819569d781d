"""Session metrics (R-86) against a fake server."""

import unittest
from datetime import datetime, timedelta, timezone

import sbx_client
from fakeserver import FakeServer, Reply, error

SAMPLE = {
    "timestamp": "2026-11-27T12:00:05.25Z", "cpu_used_pct": 42.5, "cpu_count": 0.5,
    "memory_used_bytes": 200 << 20, "memory_cache_bytes": 1 << 20, "memory_limit_bytes": 512 << 20,
    "disk_used_bytes": 50 << 20, "disk_limit_bytes": 1 << 30, "pids": 7, "pids_limit": 256,
}


class MetricsTest(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.c = sbx_client.Client(self.srv.url, timeout=5)
        self.addCleanup(self.c.close)

    def test_readings(self):
        self.srv.route("GET", r"/api/v1/sessions/s1/metrics", lambda r: Reply(json={
            "session_id": "s1", "sandbox": "running", "interval_seconds": 5,
            "current": SAMPLE, "samples": [SAMPLE, dict(SAMPLE, cpu_used_pct=0)],
        }))
        m = self.c.session_metrics("s1")
        self.assertEqual((m.session_id, m.sandbox, m.interval_seconds), ("s1", "running", 5))
        self.assertEqual(m.current.cpu_used_pct, 42.5)
        self.assertEqual(m.current.cpu_count, 0.5)
        self.assertEqual(m.current.memory_used_bytes, 200 << 20)
        self.assertEqual(m.current.disk_limit_bytes, 1 << 30)
        self.assertEqual(m.current.pids_limit, 256)
        self.assertEqual(m.current.timestamp, datetime(2026, 11, 27, 12, 0, 5, 250000, tzinfo=timezone.utc))
        self.assertEqual([s.cpu_used_pct for s in m.samples], [42.5, 0])
        self.assertIsNone(self.srv.requests[-1].q("since"))

    def test_since_and_no_sandbox(self):
        self.srv.route("GET", r"/api/v1/sessions/s1/metrics", lambda r: Reply(json={
            "session_id": "s1", "sandbox": "hibernated", "interval_seconds": 5, "samples": [],
        }))
        m = self.c.session_metrics("s1", since=datetime(2026, 11, 27, 13, 0, tzinfo=timezone(timedelta(hours=1))))
        self.assertEqual(self.srv.requests[-1].q("since"), "2026-11-27T12:00:00Z")
        self.assertEqual((m.sandbox, m.current, m.samples), ("hibernated", None, []))
        self.c.session_metrics("s1", since=datetime(2026, 11, 27, 12, 0, 1))  # naive: UTC
        self.assertEqual(self.srv.requests[-1].q("since"), "2026-11-27T12:00:01Z")
        self.c.session_metrics("s1", since="2026-11-27T12:00:00.5Z")
        self.assertEqual(self.srv.requests[-1].q("since"), "2026-11-27T12:00:00.5Z")

    def test_another_tenants_session(self):
        self.srv.route("GET", r"/api/v1/sessions/s2/metrics", lambda r: error(404, "not_found", 'session "s2": not found'))
        with self.assertRaises(sbx_client.NotFound):
            self.c.session_metrics("s2")


if __name__ == "__main__":
    unittest.main()
