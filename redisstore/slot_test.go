package redisstore

import "testing"

func TestSlot(t *testing.T) {
	t.Parallel()
	// Reference values from the Redis Cluster specification and CLUSTER KEYSLOT.
	cases := map[string]int{
		"123456789":            12739,
		"foo":                  12182,
		"{user1000}.following": Slot("user1000"),
		"{user1000}.followers": Slot("user1000"),
		"foo{}{bar}":           Slot("foo{}{bar}"),
		"foo{{bar}}zap":        Slot("{bar"),
		"foo{bar}{zap}":        Slot("bar"),
		"":                     0,
	}
	for key, want := range cases {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	if Slot("foo{}{bar}") == Slot("bar") {
		t.Error("an empty hash tag must hash the whole key")
	}
}

func FuzzSlot(f *testing.F) {
	for _, s := range []string{"", "{", "}", "{}", "a{b}c", "{{}}", "fleetrate:{booking_com}/availability"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		s := Slot(key)
		if s < 0 || s >= 16384 {
			t.Fatalf("Slot(%q) = %d out of range", key, s)
		}
		if Slot("x{"+key+"}y") != Slot("{"+key+"}") && key != "" && indexByte(key, '}') < 0 {
			t.Fatalf("hash tag %q not honoured", key)
		}
	})
}
