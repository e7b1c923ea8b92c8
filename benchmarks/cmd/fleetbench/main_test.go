package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSpliceDoc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.md")
	doc := "# Title\n\nsummary\n" + docBegin + "\nold tables\n" + docEnd + "\ntrailer\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := spliceDoc(path, []byte("new tables\n\n")); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := "# Title\n\nsummary\n" + docBegin + "\nnew tables\n" + docEnd + "\ntrailer\n"
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	for _, bad := range []string{"no markers\n", docEnd + "\n" + docBegin + "\n", docBegin + "\nonly the start\n"} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := spliceDoc(path, nil); err == nil || !strings.Contains(err.Error(), "fleetbench:begin") {
			t.Errorf("%q: err = %v, want one naming the markers", bad, err)
		}
	}
}
