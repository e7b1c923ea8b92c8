"""The errors of the fleetrate client, named as on the Go side.

Every error the client raises is a FleetrateError. Catch the subclasses to
branch: Backpressure and GaveUp are answers about the upstream's limits,
Unavailable (and StoreUnavailable) say the service could not decide, and
Invalid and Unauthorized are mistakes in the caller's request or setup.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

__all__ = [
    "FleetrateError",
    "Backpressure",
    "GaveUp",
    "Unavailable",
    "StoreUnavailable",
    "Invalid",
    "UnknownChannel",
    "UnknownTicket",
    "Unauthorized",
]


class FleetrateError(Exception):
    """The base of every error the fleetrate client raises.

    ``code`` is the service's error code (``"invalid"``, ``"backpressure"``,
    ...) when the service answered with one, ``status`` its HTTP status (0
    when there was no answer) and ``body`` the decoded JSON error body.
    """

    def __init__(self, message: str, *, code: str = "", status: int = 0,
                 body: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(message)
        self.message: str = message
        self.code: str = code
        self.status: int = status
        self.body: Mapping[str, Any] = dict(body or {})


class Backpressure(FleetrateError):
    """The wait for the request's turn would exceed max_wait: nothing was
    booked. Try again after ``retry_after`` seconds (Go:
    *fleetrate.BackpressureError)."""

    def __init__(self, message: str, *, retry_after: float, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after: float = retry_after


class GaveUp(FleetrateError):
    """The request was still rate limited after its last attempt, or its
    deadline left no time for another (Go: *transport.GaveUpError).

    ``attempts`` is how many sends were made, ``status`` the upstream's last
    status (429, or 503 with a Retry-After) and ``retry_after`` how long the
    upstream asked to wait, in seconds (0 when it did not say).
    """

    def __init__(self, message: str, *, attempts: int, status: int = 0,
                 retry_after: float = 0.0, **kw: Any) -> None:
        # ``status`` is the upstream's status here, not the service's.
        kw.setdefault("code", "gave_up")
        super().__init__(message, **kw)
        self.attempts: int = attempts
        self.status = status
        self.retry_after: float = retry_after


class Unavailable(FleetrateError):
    """The service could not decide: it is unreachable, timed out, or shed
    the call (503). This is never a denial: the caller chooses to back off
    and retry (fail closed) or to go ahead unpaced (fail open).
    ``retry_after`` is the service's hint in seconds, 0 when none."""

    def __init__(self, message: str, *, retry_after: float = 0.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after: float = retry_after


class StoreUnavailable(Unavailable):
    """The service's store failed (503 store_unavailable): nothing was
    booked (Go: fleetrate.ErrStoreUnavailable)."""


class Invalid(FleetrateError):
    """The service refused the request as malformed (400): the message names
    the field and value (Go: fleetrate.ErrInvalid). Also raised by the
    client itself, before any call, for an argument it can check."""


class UnknownChannel(Invalid):
    """The channel is not an upstream of the service's configuration (404
    unknown_channel)."""


class UnknownTicket(Invalid):
    """The ticket was never booked, has expired (not reported within its
    report_within) or was reported already (404 unknown_ticket)."""


class Unauthorized(FleetrateError):
    """The service refused the bearer token: missing or wrong (401), or
    without the decide scope (403). A setup mistake, not an outage."""
