package headers

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// FuzzParseList checks that the parser never panics and that whatever it
// accepts serializes to a canonical form that parses back to the same
// value and serializes identically.
func FuzzParseList(f *testing.F) {
	for _, s := range []string{
		`"burst";q=100;w=60,"daily";q=1000;w=86400`,
		`"default";r=50;t=30`,
		`"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`,
		`("a" b);x=?0, 1.5;y=@12, %"f%c3%bc"`,
		`-999999999999999, 123456789012.999, *tok:/x`,
		`"a\"b\\c", ::, ?1;k`,
		"1\t,\t2", "(", `%"%`, ":", "@-", "a;b=c;b=d",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		members, err := ParseList(in)
		if err != nil {
			return
		}
		out, err := SerializeList(members)
		if err != nil {
			t.Fatalf("ParseList(%q) accepted a value SerializeList rejects: %v", in, err)
		}
		again, err := ParseList(out)
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", out, in, err)
		}
		out2, err := SerializeList(again)
		if err != nil || out2 != out {
			t.Fatalf("canonical form not stable: %q then %q (%v)", out, out2, err)
		}
		if !membersEqual(members, again) {
			t.Fatalf("round trip of %q changed the value: %+v vs %+v", in, members, again)
		}
	})
}

func membersEqual(a, b []Member) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].IsInner != b[i].IsInner || !paramsEqual(a[i].Params, b[i].Params) {
			return false
		}
		if !a[i].IsInner && !a[i].Value.Equal(b[i].Value) {
			return false
		}
		if len(a[i].Inner) != len(b[i].Inner) {
			return false
		}
		for j := range a[i].Inner {
			if !a[i].Inner[j].Value.Equal(b[i].Inner[j].Value) || !paramsEqual(a[i].Inner[j].Params, b[i].Inner[j].Params) {
				return false
			}
		}
	}
	return true
}

func paramsEqual(a, b Params) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !a[i].Value.Equal(b[i].Value) {
			return false
		}
	}
	return true
}

// FuzzFormatPolicy checks that the RateLimit-Policy builder either
// rejects its input or emits a field that the draft's rules accept and
// that parses back to the same policy, windows rounded up to seconds.
func FuzzFormatPolicy(f *testing.F) {
	f.Add("default", int64(100), "", int64(60*time.Second), []byte(nil))
	f.Add("peruser", int64(65535), "content-bytes", int64(1500*time.Millisecond), []byte("App-999"))
	f.Add("a\"b\\c", int64(0), "requests", int64(0), []byte{})
	f.Add("bad\nname", int64(-1), "\x00", int64(-5), []byte{0xff})
	f.Add("", int64(MaxInteger), "", int64(1), []byte(nil))
	f.Fuzz(func(t *testing.T, name string, quota int64, unit string, window int64, pk []byte) {
		p := Policy{Name: name, Quota: quota, Unit: unit, Window: time.Duration(window), PartitionKey: pk}
		s, err := FormatPolicy(p)
		if err != nil {
			return
		}
		if strings.ContainsAny(s, "\r\n\x00") {
			t.Fatalf("FormatPolicy emitted a control byte: %q", s)
		}
		got, err := ParsePolicy(s)
		if err != nil {
			t.Fatalf("FormatPolicy(%+v) = %q, which ParsePolicy rejects: %v", p, s, err)
		}
		if len(got) != 1 {
			t.Fatalf("parsed %d policies from %q", len(got), s)
		}
		g := got[0]
		wantWindow := time.Duration(DelaySeconds(p.Window)) * time.Second
		if g.Name != p.Name || g.Quota != p.Quota || g.Unit != p.Unit || g.Window != wantWindow ||
			!bytes.Equal(g.PartitionKey, p.PartitionKey) || (g.PartitionKey == nil) != (p.PartitionKey == nil) {
			t.Fatalf("round trip of %+v via %q gave %+v", p, s, g)
		}
	})
}

// FuzzFormatRateLimit is FuzzFormatPolicy for the RateLimit field.
func FuzzFormatRateLimit(f *testing.F) {
	f.Add("default", int64(50), int64(30*time.Second), true, []byte(nil))
	f.Add("x", int64(0), int64(1), true, []byte("k"))
	f.Add("no reset", int64(7), int64(0), false, []byte(nil))
	f.Add("\x7f", int64(-3), int64(-1), true, []byte{})
	f.Fuzz(func(t *testing.T, name string, remaining, reset int64, hasReset bool, pk []byte) {
		l := Limit{Name: name, Remaining: remaining, Reset: time.Duration(reset), HasReset: hasReset, PartitionKey: pk}
		s, err := FormatRateLimit(l)
		if err != nil {
			return
		}
		if strings.ContainsAny(s, "\r\n\x00") {
			t.Fatalf("FormatRateLimit emitted a control byte: %q", s)
		}
		got, err := ParseRateLimit(s)
		if err != nil {
			t.Fatalf("FormatRateLimit(%+v) = %q, which ParseRateLimit rejects: %v", l, s, err)
		}
		g := got[0]
		want := l
		if want.HasReset {
			want.Reset = time.Duration(DelaySeconds(l.Reset)) * time.Second
		} else {
			want.Reset = 0
		}
		if len(got) != 1 || g.Name != want.Name || g.Remaining != want.Remaining || g.HasReset != want.HasReset ||
			g.Reset != want.Reset || !bytes.Equal(g.PartitionKey, want.PartitionKey) {
			t.Fatalf("round trip of %+v via %q gave %+v", l, s, got)
		}
	})
}
