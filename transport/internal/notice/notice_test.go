package notice

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want Message
		ok   bool
	}{
		{"p fr:{ota}/avail 2000000000", Message{Kind: Pause, Key: "{ota}/avail", Pause: 2 * time.Second}, true},
		{"p fr:{ota} with space 5", Message{Kind: Pause, Key: "{ota} with space", Pause: 5}, true},
		{"r fr:{ota}/avail", Message{Kind: Rate, Key: "{ota}/avail"}, true},
		{"p other:{ota}/avail 5", Message{}, false}, // another limiter's key
		{"r other:{ota}", Message{}, false},
		{"p fr:{ota} 0", Message{}, false},  // no pause
		{"p fr:{ota} -5", Message{}, false}, // negative
		{"p fr:{ota} 99999999999999999", Message{}, false},
		{"p fr:{ota}", Message{}, false},
		{"x fr:{ota}", Message{}, false},
		{"pp fr:{ota} 5", Message{}, false},
		{"", Message{}, false},
	} {
		got, ok := Parse(c.msg, "fr:")
		if ok != c.ok || got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, %v", c.msg, got, ok, c.want, c.ok)
		}
	}
}

// FuzzParse: Parse never panics, accepts only pauses within bounds for
// the limiter's keys, and reads back what Format wrote.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"p fr:a 5", "r fr:a", "p fr:a b 10", "p x 1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		m, ok := Parse(msg, "fr:")
		if !ok {
			return
		}
		if m.Kind == Pause && (m.Pause <= 0 || m.Pause > fleetrate.MaxWaitCap) {
			t.Fatalf("Parse(%q) accepted a pause of %v", msg, m.Pause)
		}
		back, ok := Parse(m.Format("fr:"), "fr:")
		if !ok || back != m {
			t.Fatalf("Parse(Format(%+v)) = %+v, %v", m, back, ok)
		}
	})
}
