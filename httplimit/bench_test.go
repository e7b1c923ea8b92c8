package httplimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/fleetrate/fleetrate/memstore"
)

// BenchmarkMiddleware measures the middleware's own cost over the
// in-memory store: key hashing, the take, and the headers.
func BenchmarkMiddleware(b *testing.B) {
	m, err := New(Config{Store: memstore.New(memstore.Options{}), Key: APIKey("X-API-Key")})
	if err != nil {
		b.Fatal(err)
	}
	p := messagesPolicy()
	p.Limits[0].Rate, p.Limits[0].Burst = 1e9, 1e6 // never refuse: measure the allowed path
	mw, err := m.Limit(p)
	if err != nil {
		b.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set("X-API-Key", "key-"+strconv.Itoa(i%64))
			h.ServeHTTP(httptest.NewRecorder(), r)
			i++
		}
	})
}

// BenchmarkBucketName measures key escaping on a typical and a hostile key.
func BenchmarkBucketName(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = bucketName("apikey:0123456789abcdef0123456789abcdef")
		_ = bucketName("user:{weird}\nname")
	}
}
