// Package inflight measures fleetrate's in-flight bound where the upstream
// stands: real worker processes share a credential's bucket on a real
// redis-server and call an upstream that counts the requests it is
// serving at each instant and refuses any beyond its bound
// (mockota.Concurrent), while workers are killed with kill -9 and paused
// with SIGSTOP.
package inflight
