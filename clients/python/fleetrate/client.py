"""The asyncio client of fleetrate's outbound protocol (POST /v1/outbound/book
and /v1/outbound/report of ``fleetrate serve``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import (Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional,
                    Sequence, Tuple, TypeVar, Union, cast)

from ._http import CertificateRefused, ConnectionFailed, Pool, Response
from .errors import (Backpressure, FleetrateError, GaveUp, Invalid, StoreUnavailable,
                     Unauthorized, Unavailable, UnknownChannel, UnknownTicket)

__all__ = ["Client", "Ticket", "Verdict", "HeadersLike", "NotSent", "DEFAULT_URL"]

#: The service's address when neither the url argument nor FLEETRATE_URL gives one.
DEFAULT_URL = "http://127.0.0.1:8080"

#: Headers of an upstream's answer: a mapping of names to a value or a list
#: of values (httpx.Headers, aiohttp's CIMultiDict and dict fit), or
#: (name, value) pairs.
HeadersLike = Union[Mapping[str, Any], Iterable[Tuple[str, str]]]

T = TypeVar("T")

log = logging.getLogger("fleetrate")

# How long book may wait for its turn when the caller gives no max_wait:
# the service caps the wait at its own max wait (--max-wait, 5 s by
# default), so this only bounds a service that never answers.
_UNBOUNDED_WAIT = 300.0


class NotSent(Exception):
    """Raise it (or a subclass) from a send function of Client.call when the
    request certainly did not reach the upstream: its in-flight permit is
    then given back at once instead of lapsing at its lease's end."""


@dataclass(frozen=True)
class Verdict:
    """What the service says follows an answer: nothing more (``retry``
    False), or another send of the request after sleeping ``retry_in``
    seconds, booked with ``attempt`` (the fleet is paused already)."""

    retry: bool
    retry_in: float = 0.0
    attempt: int = 0


@dataclass
class Ticket:
    """A booked send of a request: send it at once, then report its answer
    with report (or failed) within ``report_within`` seconds, exactly once.

    ``endpoint`` is the endpoint the request counts against, ``waited`` how
    long the service waited for its turn (seconds) and ``attempt`` which send
    of the request this is (1 for the first).

    Call ``mark_sent()`` just before the request goes out and
    ``mark_answered()`` when its answer's status line arrives (``call`` and
    the httpx transport do): the report then carries this worker's own
    timing, so that an endpoint's spacing gate judges when the request
    reached the upstream rather than taking this worker's delays for the
    upstream's.
    """

    client: "Client" = field(repr=False)
    ticket: str
    channel: str
    endpoint: str
    attempt: int
    waited: float
    report_within: float
    booked_at: float = field(default_factory=time.monotonic, repr=False)
    reported: bool = field(default=False, repr=False)
    # How long the booking's answer may have been on its way: the book
    # call's time less the service's wait (seconds).
    transit: float = field(default=0.0, repr=False)
    sent_at: Optional[float] = field(default=None, repr=False)
    answered_at: Optional[float] = field(default=None, repr=False)

    def mark_sent(self) -> None:
        """Note that the request goes out now."""
        self.sent_at = time.monotonic()

    def mark_answered(self) -> None:
        """Note that the upstream's answer arrived now."""
        self.answered_at = time.monotonic()

    def _timing(self, body: Dict[str, Any]) -> None:
        """Add the marked timing to a report's body."""
        if self.sent_at is None:
            return
        body["sent_after_ms"] = round(max(self.sent_at - self.booked_at + self.transit, 0.0) * 1000, 3)
        if self.answered_at is not None:
            body["rtt_ms"] = round(max(self.answered_at - self.sent_at, 0.0) * 1000, 3)

    async def report(self, status: int, headers: Optional[HeadersLike] = None,
                     costs: Optional[Mapping[str, int]] = None) -> Verdict:
        """Report the upstream's answer: its HTTP status and headers
        (Retry-After and rate-limit fields are read from them), and, when
        known, what the request really cost by meter (``costs`` settles the
        booking). Returns what to do next; raises GaveUp when the request is
        still rate limited after its last attempt."""
        body: Dict[str, Any] = {"ticket": self.ticket, "status": _int("status", status)}
        if headers is not None:
            body["headers"] = headers_json(headers)
        if costs is not None:
            body["costs"] = _costs("costs", costs)
        self._timing(body)
        return await self._report(body)

    async def failed(self, error: str, sent: bool = True,
                     costs: Optional[Mapping[str, int]] = None) -> Verdict:
        """Report that the round trip failed without an answer: ``error`` is
        a short text ("timeout", "connection reset"), ``sent`` whether the
        request may have reached the upstream (True keeps its in-flight
        permit until its lease ends, since the upstream may still be running
        it; False gives it back at once)."""
        if not isinstance(sent, bool):
            raise Invalid(f"sent: must be a bool, got {sent!r}", code="invalid")
        body: Dict[str, Any] = {"ticket": self.ticket, "error": str(error) or "error", "sent": sent}
        if costs is not None:
            body["costs"] = _costs("costs", costs)
        self._timing(body)
        return await self._report(body)

    async def _report(self, body: Dict[str, Any]) -> Verdict:
        self.reported = True
        t0 = time.monotonic()
        try:
            v = await self.client._post("/v1/outbound/report", body, self.client.timeout)
        finally:
            self.client._service_time(time.monotonic() - t0)
        if v.get("gave_up"):
            # The message is "message" (the contract) or "error" (the
            # service's form of its other errors), unless that is the code.
            text = v.get("message") or (v.get("error") if v.get("error") != "gave_up" else None)
            raise GaveUp(
                str(text or f"{self.channel}/{self.endpoint}: gave up after "
                    f"{v.get('attempts', self.attempt)} attempts"),
                attempts=int(v.get("attempts") or self.attempt),
                status=int(v.get("status") or 0),
                retry_after=float(v.get("retry_after_ms") or 0) / 1000,
                body=v)
        if v.get("retry"):
            return Verdict(True, float(v.get("retry_in_ms") or 0) / 1000,
                           int(v.get("attempt") or self.attempt + 1))
        return Verdict(False, 0.0, self.attempt)


class Client:
    """A client of one ``fleetrate serve``'s outbound protocol.

    ``url`` defaults to the environment variable FLEETRATE_URL, then
    http://127.0.0.1:8080; ``token`` (the bearer token, with the decide
    scope) to FLEETRATE_TOKEN. ``timeout`` bounds each call to the service
    in seconds, beyond the wait for a turn that book asks for. Connections
    are kept alive and reused (``max_idle`` of them); https URLs use
    ``ssl_context`` or the system's default one.

    Use it from one event loop, and close it (``await client.close()`` or
    ``async with Client() as client``) when done.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: float = 10.0, max_idle: int = 32,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self.url: str = (url or os.environ.get("FLEETRATE_URL") or DEFAULT_URL).rstrip("/")
        if token is None:
            token = os.environ.get("FLEETRATE_TOKEN") or None
        self.token: Optional[str] = token
        if not timeout > 0:
            raise Invalid(f"timeout: must be > 0 seconds, got {timeout!r}", code="invalid")
        self.timeout: float = float(timeout)
        try:
            self._pool = Pool(self.url, max_idle=max_idle, ssl_context=ssl_context)
        except ValueError as e:
            raise Invalid(str(e), code="invalid") from None
        self._headers: Dict[str, str] = {}
        if token:
            self._headers["Authorization"] = "Bearer " + token
        #: Calls to the service (book and report), the seconds they took,
        #: waits for a turn included, and the part of those seconds spent
        #: waiting: the waits the service reports for the turns booked, and
        #: the whole of each booking refused with Backpressure (which may
        #: have waited up to max_wait). service_seconds - service_waited is
        #: what the protocol itself costs.
        self.service_calls: int = 0
        self.service_seconds: float = 0.0
        self.service_waited: float = 0.0

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the kept-alive connections."""
        await self._pool.close()

    def _service_time(self, seconds: float) -> None:
        self.service_calls += 1
        self.service_seconds += seconds

    async def book(self, channel: str, method: str, path: str, *, attempt: int = 1,
                   max_wait: Optional[float] = None, priority: Optional[str] = None,
                   entity: Optional[str] = None, costs: Optional[Mapping[str, int]] = None,
                   host: Optional[str] = None) -> Ticket:
        """Wait for the turn of a request to the upstream ``channel`` and
        return its Ticket: send the request at once, then report.

        ``method`` and ``path`` (with its query, if any) route the request to
        an endpoint of the channel; ``host`` matters for host patterns.
        ``attempt`` is which send this is (a retry books with the attempt the
        Verdict gave). ``max_wait`` (seconds) is the longest to wait; when the
        wait would be longer, Backpressure is raised and nothing is booked.
        ``priority`` is a priority class of the upstream, ``entity`` a label
        for the service's logs, ``costs`` the request's estimated costs by
        meter (replacing the endpoint's).

        Raises Backpressure, StoreUnavailable or Unavailable, Invalid (the
        message names the field), UnknownChannel, or Unauthorized.
        """
        body: Dict[str, Any] = {
            "channel": _str("channel", channel),
            "method": _str("method", method),
            "path": _str("path", path),
            "attempt": _int("attempt", attempt),
        }
        wait = _UNBOUNDED_WAIT
        if max_wait is not None:
            if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)):
                raise Invalid(f"max_wait: must be a number of seconds, got {max_wait!r}", code="invalid")
            body["max_wait_ms"] = max_wait * 1000
            wait = max(float(max_wait), 0.0)
        if priority is not None:
            body["priority"] = _str("priority", priority)
        if entity is not None:
            body["entity"] = _str("entity", entity)
        if costs is not None:
            body["costs"] = _costs("costs", costs)
        if host is not None:
            body["host"] = _str("host", host)
        t0 = time.monotonic()
        try:
            b = await self._post("/v1/outbound/book", body, self.timeout + wait)
        except Backpressure:
            self.service_waited += time.monotonic() - t0
            raise
        finally:
            self._service_time(time.monotonic() - t0)
        ticket = b.get("ticket")
        if not isinstance(ticket, str) or not ticket:
            raise FleetrateError(f"book: the service's answer has no ticket: {b!r}")
        waited = float(b.get("waited_ms") or 0) / 1000
        self.service_waited += waited
        return Ticket(client=self, ticket=ticket, channel=channel,
                      endpoint=str(b.get("endpoint") or ""), attempt=attempt,
                      waited=waited,
                      report_within=float(b.get("report_within_ms") or 60000) / 1000,
                      transit=max(time.monotonic() - t0 - waited, 0.0))

    async def call(self, channel: str, method: str, path: str,
                   send: Callable[[], Awaitable[Tuple[int, HeadersLike, T]]], *,
                   max_wait: Optional[float] = None, priority: Optional[str] = None,
                   entity: Optional[str] = None, costs: Optional[Mapping[str, int]] = None,
                   host: Optional[str] = None,
                   settle: Optional[Callable[[T], Optional[Mapping[str, int]]]] = None) -> T:
        """Send a request paced by the service, retrying as it says, as Go's
        transport.Transport does: book, ``await send()``, report, and when
        the verdict is to retry, sleep and do it again; the result of the
        last send is returned.

        ``send`` does the real request and returns ``(status, headers,
        result)``; it is called once per attempt, so it must be able to send
        the request again. ``settle(result)`` may return the request's
        actual costs by meter, reported with the answer. When send raises,
        the failure is reported (sent=False for NotSent and a refused
        connection, else True) and the exception re-raised unless the
        service says to retry. When the report of an answer fails (the
        service unavailable, the ticket expired), the answer is returned
        as it is, with a warning on the "fleetrate" logger: the upstream
        may have carried the request out. The other arguments are book's.

        Raises GaveUp when the request is still rate limited after its last
        attempt, and what book raises (Backpressure, ...).
        """
        attempt = 1
        while True:
            ticket = await self.book(channel, method, path, attempt=attempt, max_wait=max_wait,
                                     priority=priority, entity=entity, costs=costs, host=host)
            try:
                ticket.mark_sent()
                status, headers, result = await send()
                ticket.mark_answered()
            except asyncio.CancelledError:
                _report_in_background(ticket.failed("cancelled", sent=True))
                raise
            except Exception as e:
                verdict = await failed_or_keep(ticket, e, sent_guess(e))
                if not verdict.retry:
                    raise
            else:
                actual = settle(result) if settle is not None else None
                verdict = await report_or_keep(ticket, status, headers, actual)
                if not verdict.retry:
                    return result
            await asyncio.sleep(verdict.retry_in)
            attempt = verdict.attempt

    async def _post(self, path: str, body: Mapping[str, Any], timeout: float) -> Dict[str, Any]:
        """POST body as JSON; return the decoded 200 answer or raise the
        error the service's answer means."""
        data = json.dumps(body, separators=(",", ":")).encode()
        try:
            resp = await self._pool.post(path, data, self._headers, timeout)
        except ConnectionFailed as e:
            raise Unavailable(f"fleetrate {self.url}{path}: {e}") from e
        except CertificateRefused as e:
            raise FleetrateError(f"fleetrate {self.url}{path}: {e}", code="certificate") from e
        if resp.status == 200:
            out = resp.json()
            if not isinstance(out, dict):
                raise FleetrateError(f"fleetrate {path}: the answer is not a JSON object", status=200)
            return out
        raise _error(path, resp)


def _error(path: str, resp: Response) -> FleetrateError:
    body = resp.json()
    if not isinstance(body, dict):
        body = {}
    # The contract's {"error": code, "message": text}, or the service's
    # older {"error": text, "code": code}.
    if "message" in body:
        code, msg = str(body.get("error") or ""), str(body.get("message") or "")
    else:
        code, msg = str(body.get("code") or ""), str(body.get("error") or "")
    if not msg:
        msg = resp.body[:200].decode("utf-8", "replace").strip() or f"HTTP {resp.status}"
    text = f"fleetrate {path}: HTTP {resp.status}" + (f" {code}" if code else "") + f": {msg}"
    kw: Dict[str, Any] = {"code": code, "status": resp.status, "body": body}
    s = resp.status
    if s in (401, 403):
        return Unauthorized(text, **kw)
    if s == 400:
        return Invalid(text, **kw)
    if s == 404 and code == "unknown_channel":
        return UnknownChannel(text, **kw)
    if s == 404 and code == "unknown_ticket":
        return UnknownTicket(text, **kw)
    if s == 429:
        return Backpressure(text, retry_after=_retry_after(body, resp), **kw)
    if s == 503 and code == "store_unavailable":
        return StoreUnavailable(text, retry_after=_retry_after(body, resp), **kw)
    if s >= 500:
        return Unavailable(text, retry_after=_retry_after(body, resp), **kw)
    return FleetrateError(text, **kw)


def _retry_after(body: Mapping[str, Any], resp: Response) -> float:
    ms = body.get("retry_after_ms")
    if isinstance(ms, (int, float)) and not isinstance(ms, bool):
        return max(float(ms) / 1000, 0.0)
    try:
        return max(float(resp.headers.get("retry-after", "0")), 0.0)
    except ValueError:
        return 0.0


async def report_or_keep(ticket: Ticket, status: int, headers: HeadersLike,
                         costs: Optional[Mapping[str, int]]) -> Verdict:
    """Report an answer; when the report itself fails (the service is
    unavailable, or the ticket expired while the request ran), log it and
    say not to retry: the upstream did answer, and a request it may have
    carried out must not be sent again, nor its answer lost. GaveUp and
    the other errors are raised."""
    try:
        return await ticket.report(status, headers, costs=costs)
    except (Unavailable, UnknownTicket) as e:
        log.warning("fleetrate: %s/%s: the answer (HTTP %d) could not be reported: %s",
                    ticket.channel, ticket.endpoint, status, e)
        return Verdict(False, 0.0, ticket.attempt)


async def failed_or_keep(ticket: Ticket, error: BaseException, sent: bool) -> Verdict:
    """Report a failed send; when the report itself fails (the service
    unavailable, the ticket expired), log it and say not to retry, so that
    the send's own error reaches the caller rather than the report's."""
    try:
        return await ticket.failed(describe_error(error), sent=sent)
    except (Unavailable, UnknownTicket) as e:
        log.warning("fleetrate: %s/%s: the failed send (%s) could not be reported: %s",
                    ticket.channel, ticket.endpoint, describe_error(error), e)
        return Verdict(False, 0.0, ticket.attempt)


def headers_json(headers: HeadersLike) -> Dict[str, Union[str, List[str]]]:
    """Headers as the report's JSON wants them: lower-cased names to a
    value, or to a list of values for a repeated header."""
    items: Iterable[Tuple[str, Any]]
    multi = getattr(headers, "multi_items", None)  # httpx.Headers
    pairs = getattr(headers, "items", None)  # dict, CIMultiDict, http.client.HTTPMessage
    if callable(multi):
        items = multi()
    elif callable(pairs):
        items = pairs()
    else:
        items = cast(Iterable[Tuple[str, Any]], headers)
    out: Dict[str, List[str]] = {}
    for k, v in items:
        vals: Sequence[Any] = v if isinstance(v, (list, tuple)) else (v,)
        out.setdefault(str(k).lower(), []).extend(str(x) for x in vals)
    return {k: v[0] if len(v) == 1 else v for k, v in out.items()}


def describe_error(e: BaseException) -> str:
    """A short text for a failed round trip, as report's ``error``."""
    name = type(e).__name__
    text = str(e)
    return f"{name}: {text}"[:200] if text else name


def sent_guess(e: BaseException) -> bool:
    """Whether a failed round trip may have reached the upstream: False only
    when it certainly did not (NotSent, a refused connection, a failed name
    lookup)."""
    return not isinstance(e, (NotSent, ConnectionRefusedError, socket.gaierror))


_background: "set[asyncio.Task[Any]]" = set()


def _report_in_background(aw: Awaitable[Any]) -> None:
    """Report a cancelled send without waiting for it (the caller is being
    cancelled); errors are ignored: an unreported ticket lapses anyway."""

    async def run() -> None:
        try:
            await aw
        except Exception:
            pass

    try:
        task = asyncio.get_running_loop().create_task(run())
    except RuntimeError:  # pragma: no cover - no loop
        return
    _background.add(task)
    task.add_done_callback(_background.discard)


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise Invalid(f"{name}: must be a string, got {v!r}", code="invalid")
    return v


def _int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Invalid(f"{name}: must be an integer, got {v!r}", code="invalid")
    return v


def _costs(name: str, costs: Mapping[str, int]) -> Dict[str, int]:
    if not isinstance(costs, Mapping):
        raise Invalid(f"{name}: must be a mapping of meter names to integers, got {costs!r}", code="invalid")
    return {_str(f"{name} meter name", k): _int(f"{name}[{k!r}]", v) for k, v in costs.items()}
