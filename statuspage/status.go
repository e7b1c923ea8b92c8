package statuspage

import "time"

// Status is the page's data, served as JSON at status.json (see
// docs/API.md). Durations are milliseconds; rates are per second.
type Status struct {
	// Title heads the page.
	Title string `json:"title"`
	// At is when the data was read.
	At time.Time `json:"at"`
	// IntervalMS is how often the page refreshes.
	IntervalMS int64 `json:"interval_ms"`
	// RateWindowS is the span, in seconds, the per-second rates are
	// averaged over (0 on the first refresh).
	RateWindowS float64 `json:"rate_window_s"`
	// Counting is false when the page has no Counter: decisions, denials
	// and top denied keys are then absent, not zero.
	Counting bool `json:"counting"`
	// Totals are the decisions of every bucket.
	Totals Totals `json:"totals"`
	// Buckets are the buckets shown, in the order given.
	Buckets []BucketStatus `json:"buckets"`
	// Hidden counts the buckets past MaxBuckets, not shown.
	Hidden int `json:"hidden,omitempty"`
	// TopDenied are the keys denied most over the last DeniedWinS
	// seconds, most denied first.
	TopDenied []DeniedKey `json:"top_denied"`
	// DeniedWinS is the window of TopDenied, in seconds.
	DeniedWinS float64 `json:"top_denied_window_s"`
	// DeniedOverflow counts denials in the window of keys past the bound
	// on remembered keys, not attributed to a key.
	DeniedOverflow int64 `json:"top_denied_overflow,omitempty"`
	// Upstreams are the outbound upstream rows, when a provider is set.
	Upstreams []Upstream `json:"upstreams"`
	// UpstreamError says why the upstream provider failed, if it did.
	UpstreamError string `json:"upstream_error,omitempty"`
	// HasEffectiveRate is true when some upstream row has an effective
	// rate (of its endpoint or its credential); the page hides the column
	// otherwise, as when adaptive pacing is off.
	HasEffectiveRate bool `json:"has_effective_rate"`
}

// Totals are the decisions of every bucket the Counter saw. A take of
// several buckets counts once here.
type Totals struct {
	Decisions     int64   `json:"decisions"`
	Denied        int64   `json:"denied"`
	Errors        int64   `json:"errors"`
	DecisionsPerS float64 `json:"decisions_per_s"`
	DeniedPerS    float64 `json:"denied_per_s"`
	// OtherDecisions and OtherDenied count, per bucket, the decisions of
	// buckets the page does not show (e.g. one bucket per API key).
	OtherDecisions int64 `json:"other_decisions"`
	OtherDenied    int64 `json:"other_denied"`
}

// BucketStatus is one bucket's row.
type BucketStatus struct {
	Name string `json:"name"`
	// Limits describe every limit, e.g. "20/s burst 40", or with its
	// name, "second (20/s burst 40)".
	Limits []string `json:"limits"`
	// Limit names the limit with the fewest tokens left; Burst is its
	// capacity and Remaining its tokens.
	Limit     string `json:"limit"`
	Burst     int64  `json:"burst"`
	Remaining int64  `json:"remaining"`
	// Fill is Remaining / Burst, from 0 (empty or in debt) to 1 (full).
	Fill float64 `json:"fill"`
	// TimeToFullMS is how long until every limit is full again.
	TimeToFullMS float64 `json:"time_to_full_ms"`
	// InDebtMS is, when the bucket is drained or booked ahead, how long
	// until a take would be granted; 0 otherwise.
	InDebtMS float64 `json:"in_debt_ms"`
	// Decisions and Denied count the takes of this bucket since the
	// Counter started; the rates are over RateWindowS.
	Decisions     int64   `json:"decisions"`
	Denied        int64   `json:"denied"`
	DecisionsPerS float64 `json:"decisions_per_s"`
	DeniedPerS    float64 `json:"denied_per_s"`
	// Error says why the peek failed (the store did not answer).
	Error string `json:"error,omitempty"`
}

// DeniedKey is one of the keys denied most.
type DeniedKey struct {
	// Key is "h:" and the first 12 hex digits of the SHA-256 of the
	// store key (prefix and key): never the key itself, which may hold
	// a client's secret.
	Key string `json:"key"`
	// Bucket names the bucket when the page shows it.
	Bucket string `json:"bucket,omitempty"`
	// Denied counts its denials over the window.
	Denied int64 `json:"denied"`
}

// Upstream is one outbound (channel, endpoint) row, as a provider
// reports it. Fields a provider cannot know stay zero and are shown
// empty.
type Upstream struct {
	Channel  string `json:"channel"`
	Endpoint string `json:"endpoint"`
	// PausedFor is how much longer the fleet holds off this endpoint
	// after a 429; 0 when it is not paused. The page shows PausedUntil.
	PausedFor time.Duration `json:"-"`
	// PausedUntil is filled from PausedFor at each refresh.
	PausedUntil *time.Time `json:"paused_until,omitempty"`
	// PausedForMS is PausedFor in milliseconds.
	PausedForMS float64 `json:"paused_for_ms"`
	// Reason says why it is paused, e.g. "429 Retry-After 30s".
	Reason string `json:"reason,omitempty"`
	// LastRetryAfter is the last Retry-After the upstream sent, when
	// known.
	LastRetryAfter time.Duration `json:"-"`
	// LastRetryAfterMS is LastRetryAfter in milliseconds.
	LastRetryAfterMS float64 `json:"last_retry_after_ms,omitempty"`
	// RateLimitedPerMin is the rate-limit answers (429, or 503 with
	// Retry-After) per minute; negative when unknown.
	RateLimitedPerMin float64 `json:"rate_limited_per_min"`
	// RateLimited counts them since the process started; negative when
	// unknown.
	RateLimited int64 `json:"rate_limited"`
	// DocumentedRate is the endpoint's configured rate, per second: the
	// slowest of its limits.
	DocumentedRate float64 `json:"documented_rate,omitempty"`
	// EffectiveRate is the rate the fleet currently paces the endpoint at
	// (adaptive pacing: the documented rate, lowered by recent 429s and
	// climbing back), per second; 0 when adaptation is off for it or
	// unknown.
	EffectiveRate float64 `json:"effective_rate,omitempty"`
	// CredentialRate is the configured rate of the channel's credential
	// bucket, which every endpoint of the channel also draws from, per
	// second (its slowest limit); 0 when the channel has none.
	CredentialRate float64 `json:"credential_rate,omitempty"`
	// CredentialEffectiveRate is the credential bucket's effective rate,
	// as EffectiveRate is the endpoint's; 0 when off, unknown or absent.
	CredentialEffectiveRate float64 `json:"credential_effective_rate,omitempty"`
	// InFlight is how many of the endpoint's requests hold an in-flight
	// permit fleet-wide (see transport.Endpoint.InFlight), of its bound
	// InFlightBound; both 0 when it has no bound. CredentialInFlight and
	// CredentialInFlightBound are the channel's credential's.
	InFlight                int64 `json:"in_flight,omitempty"`
	InFlightBound           int64 `json:"in_flight_bound,omitempty"`
	CredentialInFlight      int64 `json:"credential_in_flight,omitempty"`
	CredentialInFlightBound int64 `json:"credential_in_flight_bound,omitempty"`
}

// fill derives the JSON fields from the durations.
func (u *Upstream) fill(now time.Time) {
	if u.PausedFor > 0 {
		t := now.Add(u.PausedFor)
		u.PausedUntil = &t
	}
	u.PausedForMS = millis(u.PausedFor)
	u.LastRetryAfterMS = millis(u.LastRetryAfter)
}
