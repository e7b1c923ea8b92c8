#!/usr/bin/env python3
"""A benchmark worker of a mixed Go and Python fleet: `--concurrency`
asyncio tasks call GET upstream+path through fleetrate.httpx.PacedTransport
(booked and reported through `fleetrate serve`'s outbound protocol) until
`--duration` seconds have passed, then print one JSON line:

    {"ok": n, "status": {"200": n, "429": n}, "gave_up": n, "backpressure": n,
     "errors": [first 5], "calls": n, "elapsed_s": s, "calls_per_s": x,
     "service_ms_per_call": mean ms in book+report (waits for turns included),
     "service_overhead_ms_per_call": the same less the waits the service reports}

`{n}` in --path is replaced by a per-process call counter; --start-at
starts the run at a wall-clock time, as the other processes of the fleet.
Needs httpx.

    python3 clients/python/bench_worker.py --service http://127.0.0.1:8080 \\
        --upstream http://127.0.0.1:9000 --channel bench --path /items/{n} \\
        --concurrency 16 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402

import fleetrate  # noqa: E402
import fleetrate.httpx  # noqa: E402


async def bench(args: argparse.Namespace) -> Dict[str, Any]:
    """Run the workers; return the figures."""
    status: Dict[str, int] = {}
    errors: List[str] = []
    counts = {"gave_up": 0, "backpressure": 0, "calls": 0, "n": 0}
    async with fleetrate.Client(args.service, token=args.token) as fr:
        transport = fleetrate.httpx.PacedTransport(
            fr, args.channel, httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=args.concurrency * 2)),
            max_wait=args.max_wait)
        async with httpx.AsyncClient(transport=transport, base_url=args.upstream, timeout=30) as http:
            late = 0.0
            if args.start_at is not None:  # start with the rest of the fleet
                delay = args.start_at - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    late = -delay
            start = time.monotonic()
            end = start + max(args.duration - late, 0.0)

            async def worker() -> None:
                while time.monotonic() < end:
                    counts["n"] += 1
                    path = args.path.replace("{n}", str(counts["n"]))
                    try:
                        r = await http.get(path)
                        await r.aread()
                        status[str(r.status_code)] = status.get(str(r.status_code), 0) + 1
                        counts["calls"] += 1
                    except fleetrate.GaveUp as e:
                        counts["gave_up"] += 1
                        counts["calls"] += 1
                        status[str(e.status)] = status.get(str(e.status), 0) + 1
                    except fleetrate.Backpressure as e:
                        counts["backpressure"] += 1
                        await asyncio.sleep(min(max(e.retry_after, 0.01), max(end - time.monotonic(), 0)))
                    except Exception as e:  # noqa: BLE001 - counted and shown
                        if len(errors) < 5:
                            errors.append(f"{type(e).__name__}: {e}")
                        await asyncio.sleep(0.1)

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            elapsed = time.monotonic() - start
        calls = counts["calls"]
        per_call = 1000 / calls if calls else 0.0
        return {
            "ok": status.get("200", 0),
            "status": dict(sorted(status.items())),
            "gave_up": counts["gave_up"],
            "backpressure": counts["backpressure"],
            "errors": errors,
            "calls": calls,
            "elapsed_s": round(elapsed, 3),
            "calls_per_s": round(calls / elapsed, 2) if elapsed > 0 else 0.0,
            "service_ms_per_call": round(fr.service_seconds * per_call, 3),
            "service_overhead_ms_per_call": round((fr.service_seconds - fr.service_waited) * per_call, 3),
        }


def main() -> None:
    """Parse the flags, run, print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--service", default=os.environ.get("FLEETRATE_URL", fleetrate.DEFAULT_URL),
                   help="fleetrate serve's URL (FLEETRATE_URL)")
    p.add_argument("--upstream", required=True, help="the upstream's base URL")
    p.add_argument("--channel", required=True, help="the upstream's channel in the service's config")
    p.add_argument("--path", required=True, help="the path to GET; {n} is replaced by a call counter")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent asyncio tasks")
    p.add_argument("--duration", type=float, default=10.0, help="seconds to run")
    p.add_argument("--max-wait", type=float, default=None, help="longest wait for a turn, seconds")
    p.add_argument("--start-at", type=float, default=None, metavar="UNIX_SECONDS",
                   help="start at this wall-clock time (Unix seconds) and end --duration after it, "
                        "so that the processes of a fleet run together")
    p.add_argument("--token", default=os.environ.get("FLEETRATE_TOKEN"), help="bearer token (FLEETRATE_TOKEN)")
    args = p.parse_args()
    if args.concurrency < 1 or args.duration <= 0:
        p.error("--concurrency must be >= 1 and --duration > 0")
    print(json.dumps(asyncio.run(bench(args))), flush=True)


if __name__ == "__main__":
    main()
