// Package fleetrate lets a whole fleet of workers (goroutines, processes,
// machines) share one rate allowance, and lets an API hand out fair quotas
// to its own clients.
//
// A [Limiter] takes tokens from token buckets kept in a [Store]: package
// memstore for one process, package redisstore for a fleet sharing a
// Redis (every decision is one atomic Lua script on Redis's own clock), or
// package remotestore for workers of the fleetrate service. Each bucket has
// one or more [Limit]s (a rate and a burst); in every window w the fleet
// takes at most burst + rate × w tokens, with no slack, except where
// docs/OPERATIONS.md states a measured bound (an opt-in lease, two
// configurations of one key during a rolling change, a Redis restart or
// failover without their options).
//
//   - [Limiter.Allow] / [Limiter.AllowN] take now or say no;
//   - [Limiter.Wait] / [Limiter.WaitN] book a slot in one round trip and
//     sleep until it, or fail at once with a [*BackpressureError] when the
//     wait would exceed the max wait or the context's deadline;
//   - [Limiter.Reserve] / [Limiter.ReserveN] book a slot and let the caller
//     wait, or give it back with [Reservation.Cancel];
//   - [Limiter.Drain] pauses buckets (the outbound transport does on a 429),
//     [Limiter.Refund] gives back tokens of a grant never used,
//     [Limiter.Peek] reads without taking.
//
// A store failure is an error wrapping [ErrStoreUnavailable], never a
// denial; package failsafe chooses what to do then. A caller's cancelled
// or expired context is the context's error.
//
// Package transport paces outbound HTTP calls through shared buckets and
// turns an upstream's 429 into a pause of the whole fleet; package
// httplimit protects an HTTP API per client.
//
// # For store authors
//
// A Store applies the algorithm of package gcra atomically: [Store.Take]
// decides a [Request] (several [Bucket]s, all or nothing) into a [Result],
// recording a [Booking] when the request asks for one; [Store.Cancel]
// gives a booking back exactly; [Store.Refund], [Store.Drain] and
// [Store.Reset] complete it. [Request.Validate], [ValidateBuckets] and
// [ValidateCancel] check arguments as every store must. The optional
// interfaces [Binder] (a hot path for Allow and Peek) and [MultiClock]
// (results timed by several clocks) let a store do better. Package
// storetest is the conformance suite every store passes.
package fleetrate
