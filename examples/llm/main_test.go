package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

// TestRun runs the example: every request answered, never more than the
// bound in flight at the API.
func TestRun(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"-n", "12"}, &out); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^12 requests in .*; at most ([1-4]) in flight at the API \(bound 4\)\n$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("output %q: want 12 requests and at most 4 in flight", out.String())
	}
}
