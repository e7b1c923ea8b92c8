"""bench_worker.py, the Python side of the mixed-fleet benchmark, runs and
prints its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent / "bench_worker.py"


def test_bench_worker(service: Any, upstream: Any) -> None:
    """8 tasks for 1.5 s at the channel's 50/s: about 75 calls, all 200,
    no error, with the service's time per call."""
    up = upstream(rate=60, burst=10, retry_after="1")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--service", service.url, "--upstream", up.url, "--channel", "bench",
         "--path", "/items/{n}", "--concurrency", "8", "--duration", "1.5",
         "--start-at", str(time.time() + 0.5)],
        capture_output=True, text=True, timeout=60, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["errors"] == [] and r["gave_up"] == 0, r
    assert 20 <= r["ok"] <= 1.5 * 50 + 5 + 8, r
    assert r["calls_per_s"] <= 50 * 1.5, r
    assert r["service_ms_per_call"] >= r["service_overhead_ms_per_call"] > 0, r
    assert set(r) >= {"ok", "status", "gave_up", "backpressure", "errors", "calls_per_s", "service_ms_per_call"}
    assert 1.3 <= r["elapsed_s"] <= 4, r  # --duration counted from --start-at
