package redisstore

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// oneLimitValue is the binary value of a one-limit bucket, as the scripts
// write it.
func oneLimitValue(stamp, debt, fill int64) string {
	b := []byte(oneLimitTag)
	for _, v := range []int64{stamp, debt, fill} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(v)))
	}
	return string(b)
}

// binaryValue is a one-limit binary value of tag tag and numbers v.
func binaryValue(tag string, v ...int64) string {
	b := []byte(tag)
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(x)))
	}
	return string(b)
}

// TestLeadsAreRead: the one-limit binary values with leads, and the text
// form with leads (anchored or not), read back with them; a text value
// whose leads do not match its limits is not a bucket.
func TestLeadsAreRead(t *testing.T) {
	l := gcra.Lead{Start: 1_796_000_000_500_000, Min: 7_000, PrevStart: 1_795_999_000_000_000, PrevMin: 9_000}
	for _, c := range []struct {
		raw    string
		leads  []gcra.Lead
		anchor int64
	}{
		{binaryValue(leadsTag, 1_796_000_000_000_000, 5_000_000, 2_000_000_000, l.Start, l.Min, l.PrevStart, l.PrevMin), []gcra.Lead{l}, 0},
		{binaryValue(anchoredLeadsTag, 1_796_000_000_000_000, 5_000_000, 2_000_000_000, 1_795_999_000_000_000, 1_796_000_500_000_000, l.Start, l.Min, l.PrevStart, l.PrevMin), []gcra.Lead{l}, 1_795_999_000_000_000},
		{"1796000000000000 5000000 -2000000000 7 -9 L 1796000000500000 7000 1795999000000000 9000 1 2 3 4", []gcra.Lead{l, {Start: 1, Min: 2, PrevStart: 3, PrevMin: 4}}, 0},
		{"1796000000000000 5000000 -2000000000 7 -9 1795999000000000 1796000500000000 L 1796000000500000 7000 1795999000000000 9000 1 2 3 4", []gcra.Lead{l, {Start: 1, Min: 2, PrevStart: 3, PrevMin: 4}}, 1_795_999_000_000_000},
	} {
		st, ok := parseState(c.raw)
		if !ok || !reflect.DeepEqual(st.Leads, c.leads) || st.Anchor != c.anchor || st.Debts[0] != 5_000_000 {
			t.Errorf("parseState(%q) = %+v, %v; want leads %+v, anchor %d", c.raw, st, ok, c.leads, c.anchor)
		}
	}
	for _, raw := range []string{
		"1796000000000000 5000000 -2000000000 L 1 2 3 4 5 6 7 8",
		"1796000000000000 5000000 -2000000000 L 1 2 3",
		"1796000000000000 5000000 -2000000000 L 1 2 3 -4",
	} {
		if st, ok := parseState(raw); ok {
			t.Errorf("parseState(%q) = %+v, true; want not a bucket", raw, st)
		}
	}
}

// anchoredValue is the binary value of an anchored one-limit bucket.
func anchoredValue(stamp, debt, fill, anchor, horizon int64) string {
	b := []byte(anchoredTag)
	for _, v := range []int64{stamp, debt, fill, anchor, horizon} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(v)))
	}
	return string(b)
}

// TestAnchoredValuesAreRead: both encodings of an anchored state (see
// gcra.State.Anchor) read back with their anchor.
func TestAnchoredValuesAreRead(t *testing.T) {
	for _, raw := range []string{
		anchoredValue(1_796_000_000_000_000, 5_000_000, 2_000_000_000, 1_795_999_000_000_000, 1_796_000_500_000_000),
		"1796000000000000 5000000 -2000000000 1795999000000000 1796000500000000",
		"1796000000000000 5000000 -2000000000 7 -9 1795999000000000 1796000500000000",
	} {
		st, ok := parseState(raw)
		if !ok || st.Anchor != 1_795_999_000_000_000 || st.Horizon != 1_796_000_500_000_000 || st.Debts[0] != 5_000_000 || st.Fills[0] != 2_000_000_000 {
			t.Errorf("parseState(%q) = %+v, %v; want anchor 1795999000000000, horizon 1796000500000000", raw, st, ok)
		}
	}
}

// TestEveryValueEncodingIsRead writes a one-limit bucket in each encoding a
// version of the store has written (binary; text with fill times; text
// without), for the take's own limit and for another one (converted), then
// takes from it, plain and batched, and checks the decision and the state
// written (its leads too: a value without them knows none) against
// gcra.Decide from the state that was written, and that the state is then
// binary, with leads.
func TestEveryValueEncodingIsRead(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	lim := fleetrate.PerSecond(10, 20) // fill time 2 s
	fill := lim.Burst * lim.Interval()
	encodings := []struct {
		name   string
		fills  []int64 // nil: none kept
		encode func(stamp, debt, fill int64) string
	}{
		{"binary", []int64{fill}, oneLimitValue},
		{"binary, other limit", []int64{3 * fill}, oneLimitValue},
		{"text", []int64{fill}, func(s, d, f int64) string { return fmt.Sprintf("%d %d -%d", s, d, f) }},
		{"text, other limit", []int64{fill / 4}, func(s, d, f int64) string { return fmt.Sprintf("%d %d -%d", s, d, f) }},
		{"text without fill", nil, func(s, d, _ int64) string { return fmt.Sprintf("%d %d", s, d) }},
	}
	for _, batch := range []bool{false, true} {
		s, err := New(srv.Client(), Options{Timeout: 2 * time.Second, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range encodings {
			t.Run(fmt.Sprintf("batch=%v/%s", batch, e.name), func(t *testing.T) {
				key := "fleetrate:enc:" + strings.ReplaceAll(t.Name(), "/", ":")
				tm, err := srv.Client().Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				before := gcra.State{Stamp: tm.UnixMicro(), Debts: []int64{int64(300 * time.Millisecond)}}
				if e.fills != nil {
					before.Fills = e.fills
				}
				f := int64(0)
				if e.fills != nil {
					f = e.fills[0]
				}
				if err := srv.Client().Set(ctx, key, e.encode(before.Stamp, before.Debts[0], f), time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "fleetrate:enc:", Key: strings.TrimPrefix(key, "fleetrate:enc:"), Limits: []fleetrate.Limit{lim}}}, N: 3}
				got, err := s.Take(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				model := []gcra.State{{Stamp: before.Stamp, Debts: slicesClone(before.Debts), Fills: slicesClone(before.Fills)}}
				want, _ := gcra.Decide(got.At.UnixMicro(), req, model)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("take from %q:\n got %+v\nwant %+v", e.name, got, want)
				}
				raw, err := srv.Client().Get(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				// Binary with the take's leads (a value without them
				// knows none: see gcra.Lead); anchored after a limit of a
				// longer fill time (see gcra.State.Anchor).
				tag := leadsTag
				if model[0].Anchor != 0 {
					tag = anchoredLeadsTag
				}
				if !strings.HasPrefix(raw, tag) {
					t.Fatalf("value after the take = %q, want the binary one-limit form %q", raw, tag)
				}
				st, ok := parseState(raw)
				if !ok || st.Stamp != got.At.UnixMicro() || !reflect.DeepEqual(st.Debts, model[0].Debts) || st.Fills[0] != fill || st.Anchor != model[0].Anchor || st.Horizon != model[0].Horizon || !reflect.DeepEqual(st.Leads, model[0].Leads) {
					t.Fatalf("state after the take = %+v (ok %v), want stamp %d, debts %v, fill %d, anchor %d, horizon %d, leads %+v", st, ok, got.At.UnixMicro(), model[0].Debts, fill, model[0].Anchor, model[0].Horizon, model[0].Leads)
				}
			})
		}
	}
}

// TestSeveralLimitsStayText checks that a bucket of several limits keeps
// the text form, which its readers parse.
func TestSeveralLimitsStayText(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(), Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "two", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 5), fleetrate.Every(time.Second, 50)}}}, N: 1}
	if _, err := s.Take(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	raw, err := srv.Client().Get(t.Context(), req.Buckets[0].StoreKey()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := parseState(raw); !ok || len(st.Debts) != 2 || strings.HasPrefix(raw, oneLimitTag) {
		t.Fatalf("value %q read as %+v, %v; want two debts in text", raw, st, ok)
	}
}

func TestParseOneLimit(t *testing.T) {
	good := oneLimitValue(1_796_000_000_000_000, 5_000_000, 2_000_000_000)
	if st, ok := parseState(good); !ok || st.Stamp != 1_796_000_000_000_000 || st.Debts[0] != 5_000_000 || st.Fills[0] != 2_000_000_000 {
		t.Fatalf("parseState(good) = %+v, %v", st, ok)
	}
	bad := func(stamp, debt, fill float64) string {
		b := []byte(oneLimitTag)
		for _, v := range []float64{stamp, debt, fill} {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
		return string(b)
	}
	for name, raw := range map[string]string{
		"negative debt": bad(1, -1, 1),
		"fractional":    bad(1.5, 1, 1),
		"NaN":           bad(1, math.NaN(), 1),
		"infinite":      bad(math.Inf(1), 1, 1),
		"2^56":          bad(1<<56, 1, 1),
		"zero fill":     bad(1, 1, 0),
		"short":         good[:len(good)-1],
	} {
		if st, ok := parseState(raw); ok {
			t.Errorf("%s: parseState = %+v, true; want not a bucket", name, st)
		}
	}
}

func FuzzParseState(f *testing.F) {
	f.Add(oneLimitValue(1_796_000_000_000_000, 5_000_000, 2_000_000_000))
	f.Add("1796000000000000 5000000 -2000000000")
	f.Add("1796000000000000 5000000 -2000000000 7 -9")
	f.Add("1796000000000000 5000000")
	f.Add("g #")
	f.Add(anchoredValue(1_796_000_000_000_000, 5_000_000, 2_000_000_000, 1_795_999_000_000_000, 1_796_000_500_000_000))
	f.Add("1796000000000000 5000000 -2000000000 7 -9 1795999000000000 1796000500000000")
	f.Add(binaryValue(leadsTag, 1_796_000_000_000_000, 5_000_000, 2_000_000_000, 1, 2, 3, 4))
	f.Add(binaryValue(anchoredLeadsTag, 1_796_000_000_000_000, 5_000_000, 2_000_000_000, 1, 2, 3, 4, 5, 6))
	f.Add("1796000000000000 5000000 -2000000000 L 1 2 3 4")
	f.Fuzz(func(t *testing.T, raw string) {
		st, ok := parseState(raw)
		if !ok {
			return
		}
		for i, d := range st.Debts {
			if d < 0 {
				t.Fatalf("%q: negative debt %d", raw, d)
			}
			if st.Fills != nil && st.Fills[i] <= 0 {
				t.Fatalf("%q: fill %d", raw, st.Fills[i])
			}
		}
		if strings.HasPrefix(raw, oneLimitTag) && len(raw) == len(oneLimitTag)+24 {
			if back := oneLimitValue(st.Stamp, st.Debts[0], st.Fills[0]); back != raw {
				t.Fatalf("%q read as %+v, written back as %q", raw, st, back)
			}
		}
		if len(st.Leads) != 0 && len(st.Leads) != len(st.Debts) {
			t.Fatalf("%q: %d leads for %d debts", raw, len(st.Leads), len(st.Debts))
		}
		if strings.HasPrefix(raw, leadsTag) && len(raw) == len(leadsTag)+56 {
			l := st.Leads[0]
			if back := binaryValue(leadsTag, st.Stamp, st.Debts[0], st.Fills[0], l.Start, l.Min, l.PrevStart, l.PrevMin); back != raw {
				t.Fatalf("%q read as %+v, written back as %q", raw, st, back)
			}
		}
		if strings.HasPrefix(raw, anchoredTag) && len(raw) == len(anchoredTag)+40 {
			if back := anchoredValue(st.Stamp, st.Debts[0], st.Fills[0], st.Anchor, st.Horizon); back != raw {
				t.Fatalf("%q read as %+v, written back as %q", raw, st, back)
			}
		}
	})
}

func slicesClone(s []int64) []int64 {
	if s == nil {
		return nil
	}
	return append([]int64(nil), s...)
}
