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
// Most upstreams also say on every answer where their client stands, in
// rate-limit header fields (the IETF draft's RateLimit and
// RateLimit-Policy, X-RateLimit-*, OpenAI's and Anthropic's). The
// transport reads them (see RateLimitHeaders) and steers the whole fleet
// by them before any 429: a stated limit below the documented one caps
// the effective rate, and fewer requests remaining before the reset than
// the bucket would grant hold the bucket down fleet-wide. Headers never
// raise anything above the documented limits.
//
// Upstream describes an API's documented limits once and yields both the
// limiter's buckets (Upstream.Buckets) and the request mapping
// (Upstream.Classifier). Bucket names carry the channel as a Redis Cluster
// hash tag, "{booking_com}/availability" and "{booking_com}", so that the
// buckets one request draws from share a slot.
//
// Events are logged with log/slog (rate_throttle_wait, rate_limited,
// rate_backpressure, rate_gave_up, rate_store_error, rate_spacing_hold,
// rate_headers_limit, rate_headers_hold, rate_headers_ignored),
// keyed by channel and
// endpoint and by the entity id set with WithEntity. Metrics go to the
// prometheus.Registerer in Options.
package transport
