package config_test

import (
	"fmt"

	"github.com/fleetrate/fleetrate/internal/config"
)

// An envoyproxy/ratelimit file loads as it is; each limit becomes a token
// bucket.
func ExampleLoad() {
	cfg, err := config.Load("fleetrate.yaml", []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: minute
      requests_per_unit: 100
      burst: 10
`))
	if err != nil {
		panic(err)
	}
	m := cfg.Domain("messaging").Match([]config.Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}})
	fmt.Println(m.Rule.ID, m.Rule.Limits[0], m.Key)
	m = cfg.Domain("messaging").Match([]config.Entry{{Key: "to_number", Value: "2061111111"}})
	fmt.Println(m.Rule.ID, m.Rule.Limits[0].Limit())
	// Output:
	// messaging.message_type_marketing.to_number 5/day rls:messaging:message_type=marketing|to_number=2061111111
	// messaging.to_number 100/minute burst 10 1.66667/s burst 10
}

// Errors name the file, the line and the field.
func ExampleLoad_error() {
	_, err := config.Load("fleetrate.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"))
	fmt.Println(err)
	// Output:
	// fleetrate.yaml:4: descriptors[0].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)
}
