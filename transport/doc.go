// Package transport paces a fleet's outbound HTTP calls to an upstream API
// through shared fleetrate buckets, and turns the upstream's 429 into a
// pause of the whole fleet.
//
// A Transport is an http.RoundTripper. For each request it asks a Classify
// function for the Target (channel, endpoint, cost), waits its turn on the
// endpoint's bucket, and on the channel's credential-wide bucket too when
// the target draws from it (both or neither), then sends. A wait longer
// than the max wait (5 s by default) fails at once with an error wrapping
// *fleetrate.BackpressureError and sends nothing, so a scheduler can back
// off instead of piling up sleeping goroutines.
//
// When the upstream answers 429, or 503 with Retry-After, the transport
// drains the endpoint's bucket for the Retry-After (see ParseRetryAfter),
// so that no worker sharing the store, in this process or another, sends
// to the endpoint until then, and the bucket refills from empty afterwards
// instead of releasing a burst. It then retries with capped exponential
// backoff and full jitter, never sooner than the Retry-After, for up to 4
// attempts by default, if the request body can be replayed (GetBody). A
// request still limited after the last attempt fails with *GaveUpError
// (errors.Is ErrGaveUp); any other upstream answer is returned as is.
//
// An endpoint that admits one request per interval and no burst (a
// strict window) is declared with Endpoint.Spacing: each request then also
// passes a fleet-wide spacing gate just before it goes out, which a late
// answer holds shut for as long as the request may have been late on the
// way (see Endpoint.Spacing).
//
// # In-flight bounds
//
// Endpoint.InFlight bounds how many of an endpoint's requests are in
// flight at once across the fleet, and Upstream.CredentialInFlight how
// many of the channel's, whatever the endpoint: an upstream that documents
// "at most 4 concurrent requests", or answers 429 past them. A request
// takes an in-flight permit together with its tokens, in the same atomic
// store take (fleetrate.Limiter.Book with a permit), so a request never
// holds a permit while it waits for tokens or the other way round. When no
// permit is free it waits in the bucket's queue, first come first served,
// within the max wait (as fleetrate.Limiter.Acquire does), else fails with
// backpressure. It holds the permit, renewed at a third of the limiter's
// Config.PermitTTL, until its response body is read to its end or closed,
// or its round trip fails before the request is written. A round trip that
// fails after it (a timeout, a cancel, a reset) does not give its permit
// back: the upstream may still be running the request, so the permit
// lapses at the end of its lease, logged (rate_permit_abandoned) and
// counted (MetricPermitsLapsed, cause "failed_after_send"). A 429 that is
// retried gives its permit back
// before the backoff. The permit is held from the booking: a request
// booked ahead sleeps until its slot holding it (a one-bucket request
// books its whole wait ahead, one drawing from its credential too at most
// Options.Lookahead), so when the rate binds, requests waiting for their
// slot count against the bound. Read every response body to its end or close it, as
// net/http asks anyway: a body dropped unclosed holds its permit until the
// garbage collector finds it, which is then logged (rate_body_unclosed)
// and counted (MetricPermitsLapsed, cause "unclosed"), and the permit
// comes back only when its lease ends. A process that dies gives its
// permits back at the same point. MetricPermitsHeld and
// MetricPermitsWaiting show the bound at work.
//
// # Meters: tokens as well as requests
//
// An upstream may count a unit of its own beside requests, such as an LLM
// API's tokens per minute. Declare it as a Meter (Upstream.Meters): a
// bucket of the channel (MeterBucket) from which each request takes what
// it costs, atomically with its endpoint's and credential's tokens. The
// cost is known before the request only as an estimate, from
// Endpoint.Costs or from Endpoint.CostFunc (the prompt plus max_tokens);
// Endpoint.Settle reads the real cost from the answer (its usage field or
// a header) once the body is read to its end or closed, and the transport
// settles the booking with fleetrate.Reservation.Settle: a meter charged
// more than it took owes the difference at once, which pushes the next
// requests back, so the upstream's budget holds whatever the estimates.
// A meter charged less gets back what fleetrate.Store.Settle gives back:
// the difference, as far as no request booked on it since relies on it
// (the least lead of the later bookings), so an estimate at the mean cost
// loses next to nothing on a busy meter. With at most F requests in
// flight (Endpoint.InFlight), each costing at most E more than its
// booking, and answer times spread over J, a meter of rate r and burst b
// keeps an upstream of rate R and burst B within its limit when r <= R
// and b + r×J + F×E <= B (docs/ARCHITECTURE.md, "Settling"): book the
// mean cost, or what a request surely costs (an LLM request's prompt) and
// let the settle charge the rest. A Classify of your own sets
// Target.Costs and Target.Settle. See examples/llm.
//
// # The upstream's own rate-limit fields
//
// Most upstreams also say on every answer where their client stands, in
// rate-limit header fields (the IETF draft's RateLimit and
// RateLimit-Policy, X-RateLimit-*, OpenAI's and Anthropic's). The
// transport reads them (see RateLimitHeaders) and steers the whole fleet
// by them before any 429: a stated limit below the documented one caps
// the effective rate (for ten of its windows, at least a minute, after
// the last answer that stated it: a cap no answer restates lapses, and
// the rate climbs again), and fewer requests remaining before the reset than
// the bucket would grant hold the bucket down fleet-wide. Token fields
// (OpenAI's and Anthropic's) steer the channel's meter named TokensMeter
// the same way: fewer tokens remaining before the reset than the meter
// would grant drain it. Headers never raise anything above the documented
// limits.
//
// Upstream describes an API's documented limits once and yields both the
// limiter's buckets (Upstream.Buckets) and the request mapping
// (Upstream.Classifier). Bucket names carry the channel as a Redis Cluster
// hash tag, "{booking_com}/availability" and "{booking_com}", so that the
// buckets one request draws from share a slot.
//
// Events are logged with log/slog (rate_throttle_wait, rate_limited,
// rate_backpressure, rate_gave_up, rate_store_error, rate_spacing_hold,
// rate_body_unclosed, rate_permit_abandoned, rate_permit_lapsed,
// rate_settle_error, rate_headers_limit, rate_headers_hold,
// rate_headers_ignored), keyed by channel and endpoint and by the entity
// id set with WithEntity. Metrics go to the
// prometheus.Registerer in Options.
package transport
