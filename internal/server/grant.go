package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// A grant is what the service hands out with every take it grants (a
// decision's "grant", a booking's "grant"), and what a refund or a cancel
// presents to give the tokens back. It is signed with the service's key
// (HMAC-SHA256), so that no caller can make one up; it names the caller's
// token (by a hash), so that no other token's caller can give it back; it
// expires; and the store remembers each one given back until then (a
// bucket of burst 1 per grant, under "<prefix>_grant:"), so that no grant
// is given back twice, even through another replica over the same store.
//
// Its form, base64url without padding, is 70 bytes:
//
//	version (1) kind (1) id (12) expiry, unix seconds (8) n (8)
//	at or stamp, unix µs (8) digest (16) | HMAC-SHA256 of the 54 before (16)
//
// where the digest is SHA-256 of the token's identity, the buckets' store
// keys and, for a cancel, the booking's debts.
type grantKind byte

const (
	grantRefund grantKind = 1
	grantCancel grantKind = 2
	// grantSettle is a refund grant's other form, for Store.Settle: the
	// same id (one marker spends both), the take's costs in its digest
	// and its slot (at plus wait) as its time.
	grantSettle grantKind = 3
	grantV1               = 1
	grantBody             = 1 + 1 + 12 + 8 + 8 + 8 + 16
	grantMAC              = 16
	// grantKeyPrefix is the keyspace, after the prefix, of the grants
	// given back; the raw store API refuses it.
	grantKeyPrefix = "_grant:"
)

func (k grantKind) String() string {
	switch k {
	case grantCancel:
		return "cancel"
	case grantSettle:
		return "settle"
	}
	return "refund"
}

// grants signs and checks grants with one key.
type grants struct {
	key []byte
	ttl time.Duration
}

func newGrants(key []byte, ttl time.Duration) (*grants, error) {
	if len(key) == 0 {
		key = make([]byte, MinGrantKeyBytes)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("server: drawing a grant key: %w", err)
		}
	}
	if ttl <= 0 {
		ttl = DefaultGrantTTL
	}
	return &grants{key: append([]byte(nil), key...), ttl: ttl}, nil
}

// claim is what a grant says.
type claim struct {
	kind   grantKind
	id     [12]byte
	exp    int64
	n      int64
	at     int64
	digest [16]byte
}

func grantDigest(callerID string, bs []fleetrate.Bucket, debts []int64) [16]byte {
	h := sha256.New()
	var n [8]byte
	put := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	put(callerID)
	binary.BigEndian.PutUint64(n[:], uint64(len(bs)))
	h.Write(n[:])
	for _, b := range bs {
		put(b.StoreKey())
	}
	for _, d := range debts {
		binary.BigEndian.PutUint64(n[:], uint64(d))
		h.Write(n[:])
	}
	var d [16]byte
	copy(d[:], h.Sum(nil))
	return d
}

func (g *grants) mac(body []byte) []byte {
	m := hmac.New(sha256.New, g.key)
	m.Write(body)
	return m.Sum(nil)[:grantMAC]
}

// issue signs a grant of n tokens taken from bs by callerID at at (a
// refund's time, or a booking's stamp).
func (g *grants) issue(kind grantKind, callerID string, bs []fleetrate.Bucket, n, at int64, debts []int64, now time.Time) string {
	c := claim{kind: kind, exp: now.Add(g.ttl).Unix(), n: n, at: at, digest: grantDigest(callerID, bs, debts)}
	_, _ = rand.Read(c.id[:])
	return g.sign(c)
}

// sign encodes and signs a claim.
func (g *grants) sign(c claim) string {
	b := make([]byte, 0, grantBody+grantMAC)
	b = append(b, grantV1, byte(c.kind))
	b = append(b, c.id[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.exp))
	b = binary.BigEndian.AppendUint64(b, uint64(c.n))
	b = binary.BigEndian.AppendUint64(b, uint64(c.at))
	b = append(b, c.digest[:]...)
	b = append(b, g.mac(b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// parseGrant checks a grant's form and signature and returns its claim,
// or the reason it is refused.
func (g *grants) parseGrant(s string) (claim, string) {
	// One spelling per grant: Strict refuses non-zero padding bits, but
	// every base64 decoder skips CR and LF, so a grant with a line break
	// inside would decode to the same claim under another spelling.
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || strings.ContainsAny(s, "\r\n") || len(raw) != grantBody+grantMAC || raw[0] != grantV1 {
		return claim{}, reasonForged
	}
	if !hmac.Equal(raw[grantBody:], g.mac(raw[:grantBody])) {
		return claim{}, reasonForged
	}
	var c claim
	c.kind = grantKind(raw[1])
	copy(c.id[:], raw[2:14])
	c.exp = int64(binary.BigEndian.Uint64(raw[14:22]))
	c.n = int64(binary.BigEndian.Uint64(raw[22:30]))
	c.at = int64(binary.BigEndian.Uint64(raw[30:38]))
	copy(c.digest[:], raw[38:54])
	return c, ""
}

// giveBack is what a refund or a cancel asks to give back.
type giveBack struct {
	kind  grantKind
	grant string
	bs    []fleetrate.Bucket
	n     int64
	at    int64 // a refund's time or a booking's stamp, 0 when not given
	debts []int64
}

// prove checks a give-back against its grant and spends the grant; it
// returns the grant's claim (zero for a caller with the admin scope that
// gave none, who may give back without one), or the refusal. The store's
// error, if spending the grant fails, is returned as is.
func (s *Server) prove(ctx context.Context, gb giveBack) (claim, error) {
	c := callerOf(ctx)
	a := s.access
	if gb.grant == "" {
		if c.scopes&ScopeAdmin != 0 {
			return claim{}, nil
		}
		return claim{}, a.refuse(c, reasonNoGrant, http.StatusForbidden, codeGrantRequired, fmt.Sprintf(
			"a %s gives back what the service granted: give the grant of the decision (its %q), or use a token with the admin scope",
			gb.kind, map[grantKind]string{grantRefund: "grant", grantCancel: "booking.grant", grantSettle: "settle_grant"}[gb.kind]))
	}
	cl, reason := a.grants.parseGrant(gb.grant)
	switch {
	case reason != "":
	case cl.kind != gb.kind:
		reason = reasonMismatch
	case cl.exp < s.opts.Clock().Unix():
		reason = reasonExpired
	case cl.digest != grantDigest(c.id, gb.bs, gb.debts) || gb.n > cl.n || gb.at != 0 && gb.at != cl.at:
		reason = reasonMismatch
	}
	if reason != "" {
		return claim{}, a.refuse(c, reason, http.StatusForbidden, codeGrantRefused, grantRefusal(reason, gb.kind))
	}
	res, err := s.store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{s.grantMarker(cl)}, N: 1})
	if err != nil {
		return claim{}, err
	}
	if !res.Allowed {
		return claim{}, a.refuse(c, reasonReplayed, http.StatusForbidden, codeGrantRefused, grantRefusal(reasonReplayed, gb.kind))
	}
	return cl, nil
}

// unspend gives a grant back to its holder after the give-back it
// allowed failed in the store, so that a retry is not taken for a replay.
func (s *Server) unspend(ctx context.Context, cl claim) {
	if cl.exp == 0 {
		return
	}
	_ = s.store.Reset(ctx, s.grantMarker(cl).StoreKey())
}

func grantRefusal(reason string, kind grantKind) string {
	switch reason {
	case reasonExpired:
		return fmt.Sprintf("the grant has expired: a %s must come within the grant's lifetime", kind)
	case reasonReplayed:
		if kind == grantSettle {
			return "the grant was already settled or given back: a grant settles once"
		}
		return "the grant was already given back"
	case reasonMismatch:
		return fmt.Sprintf("the grant does not match this %s: other buckets, booking, caller or kind, or more tokens than it granted", kind)
	}
	return "the grant is not one this service issued"
}

// grantMarker is the bucket that remembers a grant given back until it
// expires: burst 1, refilled after twice the grant's lifetime.
func (s *Server) grantMarker(cl claim) fleetrate.Bucket {
	ttl := s.access.grants.ttl.Seconds()
	return fleetrate.Bucket{Prefix: s.opts.Prefix, Key: grantKeyPrefix + hex.EncodeToString(cl.id[:]),
		Limits: []fleetrate.Limit{{Name: "grant", Rate: 1 / (2 * ttl), Burst: 1}}}
}

// grantsFor signs the grants of a granted take from bs at at, booked
// wait ahead, costing costs[i] from bs[i] (n from each when costs is
// nil), for the caller of ctx: a
// refund's (of at most the least cost), with settleToo a settle's (the
// refund's other form, so that the take is given back or settled once),
// and, with a booking, a cancel's in the booking (a copy).
func (s *Server) grantsFor(ctx context.Context, bs []fleetrate.Bucket, n int64, costs []int64, at time.Time, wait time.Duration, b *wire.Booking, settleToo bool) (refund, settle string, booking *wire.Booking) {
	id, now := callerOf(ctx).id, s.opts.Clock()
	g := s.access.grants
	least := n
	if costs != nil {
		least = slices.Min(costs)
	}
	rc := claim{kind: grantRefund, exp: now.Add(g.ttl).Unix(), n: least, at: at.UnixMicro(), digest: grantDigest(id, bs, nil)}
	_, _ = rand.Read(rc.id[:])
	sc := rc
	sc.kind, sc.n, sc.at, sc.digest = grantSettle, 0, settleSlot(at, wait), grantDigest(id, bs, costs)
	refund = g.sign(rc)
	if settleToo {
		if costs == nil {
			sc.digest = grantDigest(id, bs, each(n, len(bs)))
		}
		settle = g.sign(sc)
	}
	if b != nil {
		c := *b
		c.Grant = g.issue(grantCancel, id, bs, least, b.StampUnixMicro, bookingProof(b.DebtsNS, b.Costs), now)
		b = &c
	}
	return refund, settle, b
}

// settleSlot is a grant's slot in µs, as fleetrate.Settlement.At gives it
// (Result.At plus Result.Wait) and as a remote client computes it from
// the answer's at_unix_micro and wait_ns.
func settleSlot(at time.Time, wait time.Duration) int64 {
	return time.UnixMicro(at.UnixMicro()).Add(wait).UnixMicro()
}

// bookingProof is what a cancel grant's digest covers of a booking: its
// debts and, for a take of costs by bucket, its costs (the debts' count
// is fixed by the buckets, so the two cannot be confused).
func bookingProof(debts, costs []int64) []int64 {
	if costs == nil {
		return debts
	}
	return append(append(append([]int64(nil), debts...), -1), costs...)
}
