package headers_test

import (
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate/internal/headers"
)

func ExampleFormatPolicy() {
	v, err := headers.FormatPolicy(
		headers.Policy{Name: "burst", Quota: 20, Window: 2 * time.Second},
		headers.Policy{Name: "daily", Quota: 10000, Window: 24 * time.Hour},
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(headers.RateLimitPolicy+":", v)
	// Output: RateLimit-Policy: "burst";q=20;w=2, "daily";q=10000;w=86400
}

func ExampleFormatRateLimit() {
	v, _ := headers.FormatRateLimit(headers.Limit{Name: "burst", Remaining: 0, Reset: 1200 * time.Millisecond, HasReset: true})
	fmt.Println(headers.RateLimit+":", v)
	fmt.Println(headers.RetryAfter+":", headers.FormatRetryAfter(1200*time.Millisecond))
	// Output:
	// RateLimit: "burst";r=0;t=2
	// Retry-After: 2
}

func ExampleParseRateLimit() {
	ls, err := headers.ParseRateLimit(`"default";r=50;t=30`)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ls[0].Name, ls[0].Remaining, ls[0].Reset)
	// Output: default 50 30s
}
