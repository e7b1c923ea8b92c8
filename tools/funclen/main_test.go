package main

import (
	"go/token"
	"strings"
	"testing"
)

func TestLongFuncs(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("\t_ = 1\n", 5)
	src := "package p\n\ntype T[K any] struct{}\n\n" +
		"func short() {\n}\n\n" +
		"// long is long because it is a table.\nfunc long() {\n" + body + "}\n\n" +
		"func (t *T[K]) method() {\n" + body + "}\n"
	fns, err := longFuncs(token.NewFileSet(), "p.go", []byte(src), 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []fn{
		{lines: 7, place: "p.go:9", name: "long", reason: true},
		{lines: 7, place: "p.go:17", name: "T.method"},
	}
	if len(fns) != len(want) {
		t.Fatalf("got %+v, want %+v", fns, want)
	}
	for i := range want {
		if fns[i] != want[i] {
			t.Errorf("got %+v, want %+v", fns[i], want[i])
		}
	}
}

func TestLongFuncsRejectsBadGo(t *testing.T) {
	t.Parallel()
	if _, err := longFuncs(token.NewFileSet(), "bad.go", []byte("package p\nfunc {"), 60); err == nil {
		t.Error("no error for a file that does not parse")
	}
}
