package redisstore

import (
	"errors"
	"fmt"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
)

// decodeTake checks and replays the take script's reply for req.
// It is decodeReply for one take, with the decision kept on the stack.
func decodeTake(req fleetrate.Request, reply []int64) (fleetrate.Result, error) {
	if len(reply) < 1 {
		return fleetrate.Result{}, unavailable("take", errors.New("take script reply: empty"))
	}
	booking := req.Booking
	var one [1]fleetrate.Result
	rs, rest, err := replay(req, reply[0], reply[1:], 1, one[:0], func(int) *fleetrate.Booking { return booking })
	if err != nil {
		return fleetrate.Result{}, err
	}
	if len(rest) != 0 {
		return fleetrate.Result{}, unavailable("take", fmt.Errorf("take script reply: %d unexpected values at the end", len(rest)))
	}
	return rs[0], nil
}

// decodeReply checks and replays the reply of the take script or the
// batch script: now_us, then for each of n takes its decisions and the
// debts before them (see replay). take(i) gives the i-th take's request,
// its count and where its decisions go: into the slice's own backing when
// it has room, else into a new one. A reply the client does not agree with
// fails every take: no part of it can be trusted.
func decodeReply(reply []int64, n int, take func(i int) (fleetrate.Request, int, *[]fleetrate.Result, func(int) *fleetrate.Booking)) error {
	if len(reply) < 1 {
		return unavailable("take", errors.New("take script reply: empty"))
	}
	now, rest := reply[0], reply[1:]
	for i := range n {
		req, count, rs, book := take(i)
		var err error
		if *rs, rest, err = replay(req, now, rest, count, *rs, book); err != nil {
			return err
		}
	}
	if len(rest) != 0 {
		return unavailable("take", fmt.Errorf("take script reply: %d unexpected values at the end", len(rest)))
	}
	return nil
}

// replay reads one take's part of a script's reply, the number of
// decisions the script made for count identical takes of req and the debts
// of req's buckets before them, and returns those decisions and the rest of
// the reply. It makes the decisions again with gcra.Decide from that
// state, at the script's instant now (µs): the scripts mirror Decide, so
// the replay is exact, and a script need not report anything per decision.
// A reply the replay does not agree with is an error, never a decision.
func replay(req fleetrate.Request, now int64, reply []int64, count int, out []fleetrate.Result, book func(int) *fleetrate.Booking) ([]fleetrate.Result, []int64, error) {
	bad := func(format string, a ...any) ([]fleetrate.Result, []int64, error) {
		return nil, nil, unavailable("take", fmt.Errorf("take script reply: "+format, a...))
	}
	if len(reply) < 1 {
		return bad("ends early")
	}
	made, pos := reply[0], 1
	if made < 1 || made > int64(count) {
		return bad("%d decisions for %d takes", made, count)
	}
	var one [1]gcra.State
	states := one[:]
	if len(req.Buckets) > 1 {
		states = make([]gcra.State, len(req.Buckets))
	}
	pos, err := readDebts(req.Buckets, now, reply, pos, states)
	if err != nil {
		return bad("%v", err)
	}
	if cap(out) < int(made) {
		out = make([]fleetrate.Result, made)
	}
	out = out[:made]
	for i := range out {
		req.Booking = book(i)
		out[i], _ = gcra.Decide(now, req, states)
		last := i == len(out)-1
		if !out[i].Allowed && !last || out[i].Allowed && last && made < int64(count) {
			return bad("decision %d of %d is allowed=%v on replay", i+1, made, out[i].Allowed)
		}
	}
	return out, reply[pos:], nil
}

// readDebts reads from reply at pos the debts of each bucket before a
// take, into states at the script's instant now, and returns the position
// after them. The states share reply's memory.
func readDebts(buckets []fleetrate.Bucket, now int64, reply []int64, pos int, states []gcra.State) (int, error) {
	for b, bk := range buckets {
		m := len(bk.Limits)
		if len(reply) < pos+m {
			return 0, errors.New("ends early")
		}
		debts := reply[pos : pos+m : pos+m]
		for _, d := range debts {
			if d < 0 {
				return 0, fmt.Errorf("negative debt %d", d)
			}
		}
		states[b] = gcra.State{Stamp: now, Debts: debts}
		pos += m
	}
	return pos, nil
}
