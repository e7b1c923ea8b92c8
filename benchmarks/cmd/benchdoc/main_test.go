package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSplice(t *testing.T) {
	t.Parallel()
	doc := "# T\n\nintro\n<!-- s:begin -->\nold\n<!-- s:end -->\nafter\n"
	got, err := Splice(doc, "s", "new\n\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# T\n\nintro\n<!-- s:begin -->\nnew\n<!-- s:end -->\nafter\n"; got != want {
		t.Errorf("Splice = %q, want %q", got, want)
	}
	for name, bad := range map[string]string{
		"no markers":   "text\n",
		"reversed":     "<!-- s:end -->\n<!-- s:begin -->\n",
		"only begin":   "<!-- s:begin -->\n",
		"twice":        "<!-- s:begin -->\n<!-- s:end -->\n<!-- s:begin -->\n<!-- s:end -->\n",
		"other block":  "<!-- t:begin -->\n<!-- t:end -->\n",
		"inside lines": "a <!-- s:begin --> b\n<!-- s:end -->\n",
	} {
		if _, err := Splice(bad, "s", "x"); err == nil || !strings.Contains(err.Error(), "s:") {
			t.Errorf("%s: Splice = %v, want an error naming the marker", name, err)
		}
	}
}

func TestSpliceCmd(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte("a\n<!-- memstore:begin -->\nold\n<!-- memstore:end -->\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"splice", "-doc", path, "-section", "memstore", "-date", "2026-12-04", "-commit", "abc1234",
		"-machine", "2 CPUs", "-command", "go test ./memstore"}
	if err := run(args, strings.NewReader("| a |\n|---|\n| 1 |\n"), nil); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := "a\n<!-- memstore:begin -->\nMeasured 2026-12-04, commit abc1234, 2 CPUs: `go test ./memstore`\n\n| a |\n|---|\n| 1 |\n<!-- memstore:end -->\nb\n"
	if string(got) != want {
		t.Errorf("doc = %q, want %q", got, want)
	}
	for _, tc := range []struct{ flag, value, want string }{
		{"-date", "4 Dec", "-date"},
		{"-commit", "HEAD", "-commit"},
		{"-section", "Mem Store", "-section"},
		{"-command", "go `x`", "-command"},
	} {
		bad := append([]string(nil), args...)
		for i := range bad {
			if bad[i] == tc.flag {
				bad[i+1] = tc.value
			}
		}
		if err := run(bad, strings.NewReader("| a |\n"), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %q: err = %v, want one naming %s", tc.flag, tc.value, err, tc.want)
		}
	}
	if err := run(args, strings.NewReader("  \n"), nil); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty body: err = %v, want one saying so", err)
	}
}

func TestTables(t *testing.T) {
	t.Parallel()
	log := `=== RUN   TestA
    a_test.go:10: 400/s: 902 grants
    a_test.go:12: 
        | scenario | n |
        |---|---|
        | wait | 1 |
--- PASS: TestA (2.00s)
=== RUN   TestB
    b_test.go:3: | scenario | n |
        |---|---|
        | cancel | 2 |
    b_test.go:9: simulated:
        | upstream | 429s |
        | --- | ---: |
        | strict | 0 |
--- PASS: TestB (1.00s)
| not | a table |
PASS
`
	want := "| scenario | n |\n|---|---|\n| wait | 1 |\n| cancel | 2 |\n\n| upstream | 429s |\n| --- | ---: |\n| strict | 0 |\n"
	if got := Tables(log); got != want {
		t.Errorf("Tables =\n%s\nwant\n%s", got, want)
	}
}

func TestGoBenchTables(t *testing.T) {
	t.Parallel()
	out := `goos: linux
BenchmarkNewKeysCapRatio-2   	  100	  2000 ns/op	  1400 below-ns/take	  2000 atcap-ns/take	 1.30 ratio	 0 B/op	 0 allocs/op
BenchmarkNewKeysCapRatio-2   	  100	  2100 ns/op	  1500 below-ns/take	  2100 atcap-ns/take	 1.40 ratio	 0 B/op	 0 allocs/op
BenchmarkNewKeysCapRatio-2   	  100	  2100 ns/op	  1500 below-ns/take	  2100 atcap-ns/take	 1.20 ratio	 0 B/op	 0 allocs/op
BenchmarkRLSHotOverLimit/redis/cache=off-2 	 1000	 100 ns/op	 12000 decisions/s	 1.000 store-calls/decision
BenchmarkRLSHotOverLimit/redis/cache=on-2 	 1000	 100 ns/op	 120000 decisions/s	 0 store-calls/decision
BenchmarkDecisions/granted/bare-2 	 1000	 100 ns/op	 6000000 decisions/s
BenchmarkDecisions/granted/counted-2 	 1000	 100 ns/op	 3000000 decisions/s
BenchmarkDecisions/granted/page-open-2 	 1000	 100 ns/op	 3300000 decisions/s
PASS
`
	rs := ParseBench(out)
	for _, tc := range []struct{ table, want string }{
		{"memstore", "| two victims per sample | 2,000–2,100 | 1,400–1,500 | 1.30 (1.20–1.40) |\n"},
		{"overlimit", "| Redis | off | 12,000 | 1 |\n| Redis | on | 120,000 (10.0× off) | 0 |\n"},
		{"statuspage", "| granted | 6,000,000 | 3,000,000 | 3,300,000 | 1.10 | 0.50 |\n"},
	} {
		got, err := GoBenchTable(tc.table, rs)
		if err != nil {
			t.Fatalf("%s: %v", tc.table, err)
		}
		if !strings.HasSuffix(got, tc.want) {
			t.Errorf("%s table =\n%s\nwant it to end with\n%s", tc.table, got, tc.want)
		}
	}
	if _, err := GoBenchTable("memstore", ParseBench("PASS\n")); err == nil {
		t.Error("no results: want an error")
	}
	if _, err := GoBenchTable("nosuch", rs); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("unknown table: err = %v, want one naming it", err)
	}
}

func TestBenchTable(t *testing.T) {
	t.Parallel()
	js := `{"rows":[{"mode":"allow","config":"unbatched","concurrency":1,"keys":1,"decisions_per_second":11949,"of_ceiling":0.342,"p50_us":73,"p99_us":241},
	{"mode":"allow","config":"batch","concurrency":16,"keys":1,"decisions_per_second":1,"of_ceiling":1,"p50_us":1,"p99_us":1},
	{"mode":"allow","config":"lease","concurrency":64,"keys":1,"decisions_per_second":384268,"of_ceiling":11.09,"p50_us":153,"p99_us":443}],
	"recommendations":[{"setting":"Batch","value":"on","why":"faster\n  from 16"}]}`
	got, err := BenchTable([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	want := "| mode | config | callers | keys | decisions/s | × ceiling | p50 µs | p99 µs |\n|---|---|---|---|---|---|---|---|\n" +
		"| allow | unbatched | 1 | 1 | 11949 | 0.34 | 73 | 241 |\n| allow | lease | 64 | 1 | 384268 | 11.09 | 153 | 443 |\n" +
		"\nIts advice:\n\n- Batch: on (faster from 16)\n"
	if got != want {
		t.Errorf("BenchTable =\n%s\nwant\n%s", got, want)
	}
	if _, err := BenchTable([]byte(`{"stopped":"redis down","rows":[]}`)); err == nil || !strings.Contains(err.Error(), "redis down") {
		t.Errorf("stopped run: err = %v, want one saying why", err)
	}
	if _, err := BenchTable([]byte("not json")); err == nil {
		t.Error("garbage: want an error")
	}
}

// FuzzParseBench: any input parses without a panic, and every result has
// a name and finite metrics; the formatters never panic on what it
// returns.
func FuzzParseBench(f *testing.F) {
	f.Add("BenchmarkX-2 10 5 ns/op 1 ratio\n")
	f.Add("BenchmarkDecisions/granted/bare-2 1 1 ns/op 0 decisions/s\nBenchmarkNewKeysCapRatio 1 1 ns/op 1 below-ns/take 2 atcap-ns/take 2 ratio")
	f.Add("Benchmark 1 NaN x Inf y")
	f.Fuzz(func(t *testing.T, s string) {
		rs := ParseBench(s)
		for _, r := range rs {
			if !strings.HasPrefix(r.Name, "Benchmark") {
				t.Fatalf("result named %q", r.Name)
			}
		}
		for _, table := range []string{"memstore", "overlimit", "statuspage"} {
			_, _ = GoBenchTable(table, rs)
		}
	})
}

// FuzzTables: Tables never panics, and everything it returns is table
// lines and blank lines between tables.
func FuzzTables(f *testing.F) {
	f.Add("| a |\n|---|\n| 1 |\n")
	f.Add("    x_test.go:1: | a | b |\n        | --- | ---: |\n        | 1 | 2 |\n| a |\n|---|\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, l := range strings.Split(strings.TrimSuffix(Tables(s), "\n"), "\n") {
			if l != "" && !strings.HasPrefix(l, "|") {
				t.Fatalf("Tables returned the line %q", l)
			}
		}
		var out bytes.Buffer
		_ = run([]string{"bench"}, strings.NewReader(s), &out)
	})
}
