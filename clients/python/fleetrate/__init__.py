"""fleetrate: a Python client for the outbound protocol of ``fleetrate serve``.

A fleet of workers, in any number of processes and languages, calls a rate
limited upstream API through one fleetrate service: each request is *booked*
(the service waits its turn, honouring the fleet's pacing, pauses, spacing
gate and in-flight bound), sent, and its answer *reported* (a 429 pauses the
whole fleet, rate-limit headers steer it); the service then says whether to
send it again. Three ways to use it::

    async with fleetrate.Client() as fr:                      # FLEETRATE_URL
        # 1. by hand
        ticket = await fr.book("booking_com", "GET", "/v1/hotels/7")
        status, headers, body = await my_send()
        verdict = await ticket.report(status, headers)       # retry? when?
        # 2. the loop done for you
        body = await fr.call("booking_com", "GET", "/v1/hotels/7", my_send)
        # 3. every call of an httpx.AsyncClient (fleetrate.httpx)
        async with httpx.AsyncClient(
                transport=fleetrate.httpx.PacedTransport(fr, "booking_com")) as http:
            r = await http.get("https://api.example.com/v1/hotels/7")

The core uses only the standard library; ``fleetrate.httpx`` needs httpx.
"""

from .client import DEFAULT_URL, Client, HeadersLike, NotSent, Ticket, Verdict
from .errors import (Backpressure, FleetrateError, GaveUp, Invalid, StoreUnavailable,
                     Unauthorized, Unavailable, UnknownChannel, UnknownTicket)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Ticket",
    "Verdict",
    "HeadersLike",
    "NotSent",
    "DEFAULT_URL",
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
