package httplimit

import (
	"strings"
	"testing"
)

// FuzzBucketName checks the rule that turns client input into a bucket
// name: the result never holds a byte that could reach into another key or
// a Redis hash tag, stays short, and two different keys never share a name.
func FuzzBucketName(f *testing.F) {
	for _, s := range []string{"", "k", "{tag}", "a:b", "line\nbreak", "%41", "#x", strings.Repeat("z", 10_000), "\x00\xff"} {
		f.Add(s, s+"!")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		na, nb := bucketName(a), bucketName(b)
		for _, n := range []string{na, nb} {
			if strings.ContainsAny(n, "{}\r\n\x00 ") {
				t.Fatalf("bucket name %q holds an unsafe byte", n)
			}
			if len(n) > maxVerbatimName+1 && !strings.HasPrefix(n, "#") {
				t.Fatalf("bucket name of %d bytes was not hashed", len(n))
			}
		}
		if a != b && na == nb {
			t.Fatalf("keys %q and %q share the bucket name %q", a, b, na)
		}
		if bucketName(a) != na {
			t.Fatalf("bucketName(%q) is not stable", a)
		}
	})
}
