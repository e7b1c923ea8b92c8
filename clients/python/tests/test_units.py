"""Parts of the client that need no service."""

from __future__ import annotations

import asyncio
import email
import http.client
import logging
from typing import Any, Dict, Tuple

import httpx
import pytest

import fleetrate
from fleetrate.client import headers_json


def test_headers_json_shapes() -> None:
    """Headers in every shape a library gives them become lower-cased names
    to a value, or a list for a repeated one."""
    msg = email.message_from_string("Retry-After: 2\nX-A: 1\nX-A: 2\n\n", _class=http.client.HTTPMessage)
    assert headers_json(msg) == {"retry-after": "2", "x-a": ["1", "2"]}  # type: ignore[arg-type]
    assert headers_json(httpx.Headers([("RateLimit", "a"), ("ratelimit", "b")])) == {"ratelimit": ["a", "b"]}
    assert headers_json([("Retry-After", "3")]) == {"retry-after": "3"}
    assert headers_json({"X": ["1", "2"], "Y": 5}) == {"x": ["1", "2"], "y": "5"}


def test_client_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults from the environment; a bad URL or timeout is Invalid."""
    monkeypatch.delenv("FLEETRATE_URL", raising=False)
    monkeypatch.delenv("FLEETRATE_TOKEN", raising=False)
    c = fleetrate.Client()
    assert c.url == fleetrate.DEFAULT_URL and c.token is None
    monkeypatch.setenv("FLEETRATE_URL", "http://fr.internal:9000/")
    monkeypatch.setenv("FLEETRATE_TOKEN", "t0k")
    c = fleetrate.Client()
    assert c.url == "http://fr.internal:9000" and c.token == "t0k"
    with pytest.raises(fleetrate.Invalid, match="url"):
        fleetrate.Client("ftp://x")
    with pytest.raises(fleetrate.Invalid, match="timeout"):
        fleetrate.Client("http://x", timeout=0)


def test_answer_kept_when_the_report_fails(start_service: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The service goes away while the request is out: the upstream's
    answer is returned anyway (it may have been carried out), with a
    warning."""
    svc = start_service("upstreams:\n  - channel: c\n    endpoints:\n      - name: e\n        pattern: \"/\"\n"
                        "        rate_limit: {unit: second, requests_per_unit: 100}\n")

    async def main() -> str:
        async with fleetrate.Client(svc.url, timeout=2) as fr:
            async def send() -> Tuple[int, Dict[str, str], str]:
                svc.stop()
                return 200, {}, "the answer"

            return await fr.call("c", "GET", "/", send)

    with caplog.at_level(logging.WARNING, logger="fleetrate"):
        assert asyncio.run(main()) == "the answer"
    assert "could not be reported" in caplog.text


def test_send_error_kept_when_its_report_fails(start_service: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The service goes away, then the send fails: the caller gets the
    send's error, not the report's."""
    svc = start_service("upstreams:\n  - channel: c\n    endpoints:\n      - name: e\n        pattern: \"/\"\n"
                        "        rate_limit: {unit: second, requests_per_unit: 100}\n")

    async def main() -> None:
        async with fleetrate.Client(svc.url, timeout=2) as fr:
            async def send() -> Tuple[int, Dict[str, str], str]:
                svc.stop()
                raise TimeoutError("the upstream timed out")

            await fr.call("c", "GET", "/", send)

    with caplog.at_level(logging.WARNING, logger="fleetrate"), pytest.raises(TimeoutError):
        asyncio.run(main())
    assert "could not be reported" in caplog.text


def test_report_carries_the_workers_timing() -> None:
    """A ticket marked sent and answered reports when the request went out
    after its booking (with the booking's way back) and how long the
    upstream took; unmarked, neither."""
    client = fleetrate.Client("http://127.0.0.1:1")
    t = fleetrate.Ticket(client=client, ticket="t", channel="c", endpoint="e", attempt=1,
                         waited=0.0, report_within=60.0, booked_at=100.0, transit=0.002)
    body: Dict[str, Any] = {}
    t._timing(body)
    assert body == {}
    t.sent_at, t.answered_at = 100.003, 100.0045
    t._timing(body)
    assert body == {"sent_after_ms": 5.0, "rtt_ms": 1.5}
