package ratelimitheader

import (
	"net/http"
	"testing"
)

// BenchmarkParseNone is the common case of an upstream that sends no
// rate-limit fields: every answer is still read.
func BenchmarkParseNone(b *testing.B) {
	h := http.Header{"Content-Type": {"text/plain"}, "Date": {"x"}}
	b.ReportAllocs()
	for b.Loop() {
		Parse(h, now, All)
	}
}

// BenchmarkParseDraft reads the draft's two fields.
func BenchmarkParseDraft(b *testing.B) {
	h := http.Header{"Ratelimit-Policy": {`"p";q=10;w=1`}, "Ratelimit": {`"p";r=5;t=1`}}
	b.ReportAllocs()
	for b.Loop() {
		Parse(h, now, All)
	}
}
