package headers

import (
	"errors"
	"strings"
	"testing"
)

func TestParseListValid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
		// canonical is the serialization of the parsed value.
		canonical string
	}{
		{"empty", "", ""},
		{"spaces only", "   ", ""},
		{"integer", "42", "42"},
		{"negative integer", "-42", "-42"},
		{"leading zeros", "007", "7"},
		{"15 digits", "999999999999999", "999999999999999"},
		{"decimal", "1.5", "1.5"},
		{"decimal three places", "-0.125", "-0.125"},
		{"decimal trailing zeros", "2.500", "2.5"},
		{"decimal 12 integer digits", "123456789012.123", "123456789012.123"},
		{"string", `"hello world"`, `"hello world"`},
		{"string escapes", `"a\"b\\c"`, `"a\"b\\c"`},
		{"empty string", `""`, `""`},
		{"token", "foo123/456", "foo123/456"},
		{"token star", "*foo:bar", "*foo:bar"},
		{"byte sequence", ":aGVsbG8=:", ":aGVsbG8=:"},
		{"byte sequence unpadded", ":aGVsbG8:", ":aGVsbG8=:"},
		{"empty byte sequence", "::", "::"},
		{"true", "?1", "?1"},
		{"false", "?0", "?0"},
		{"date", "@1659578233", "@1659578233"},
		{"display string", `%"f%c3%bc%c3%bc"`, `%"f%c3%bc%c3%bc"`},
		{"params", `"a";q=1;w=60`, `"a";q=1;w=60`},
		{"boolean true param", "a;x", "a;x"},
		{"boolean true param explicit", "a;x=?1", "a;x"},
		{"boolean false param", "a;x=?0", "a;x=?0"},
		{"param space after semicolon", "a; x=1", "a;x=1"},
		{"duplicate param keeps first position", "a;x=1;y=2;x=3", "a;x=3;y=2"},
		{"list", `"a";q=1, "b";q=2`, `"a";q=1, "b";q=2`},
		{"list OWS", "1 ,\t2,3", "1, 2, 3"},
		{"list tab before comma", "1\t, 2", "1, 2"},
		{"inner list", `("a" "b");x=1, c`, `("a" "b");x=1, c`},
		{"empty inner list", "()", "()"},
		{"inner list spaces", "(  1   2  )", "(1 2)"},
		{"key with star and digits", "a;*k-9_.x=1", "a;*k-9_.x=1"},
		{"draft policy", `"burst";q=100;w=60,"daily";q=1000;w=86400`, `"burst";q=100;w=60, "daily";q=1000;w=86400`},
		{"draft pk", `"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`, `"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUA==:`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseList(tt.in)
			if err != nil {
				t.Fatalf("ParseList(%q): %v", tt.in, err)
			}
			s, err := SerializeList(got)
			if err != nil {
				t.Fatalf("SerializeList: %v", err)
			}
			if s != tt.canonical {
				t.Errorf("ParseList(%q) serializes as %q, want %q", tt.in, s, tt.canonical)
			}
		})
	}
}

func TestParseListInvalid(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		",",
		"1,",
		"1,,2",
		"1 2",
		"1;",
		"1;A=1",
		"1;=1",
		"1;a=",
		"-",
		"--1",
		"1000000000000000",
		"1234567890123.1",
		"1.",
		"1.1234",
		"1.2.3",
		`"unterminated`,
		`"bad \n escape"`,
		"\"tab\tin string\"",
		"\"caf\xc3\xa9\"",
		"\"\\",
		":aGVsbG8=",
		":a b:",
		":a=b:",
		"?",
		"?2",
		"@",
		"@1.5",
		`%"`,
		`%x`,
		`%"%C3%BC"`,
		`%"%c3"`,
		`%"%g0"`,
		"(1 2",
		"(1,2)",
		"(1)(2)",
		"a,\t",
		"\x00",
		"é",
		"1 ;a=1",
		" 1 , 2 ,",
	} {
		if got, err := ParseList(in); err == nil {
			t.Errorf("ParseList(%q) = %+v, want an error", in, got)
		} else if !errors.Is(err, ErrSyntax) {
			t.Errorf("ParseList(%q) error %v does not wrap ErrSyntax", in, err)
		}
	}
}

func TestParseListCombinesLines(t *testing.T) {
	t.Parallel()
	got, err := ParseList(`"a";q=1`, `"b";q=2`)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Value.Str != "a" || got[1].Value.Str != "b" {
		t.Errorf("got %+v, want members a and b", got)
	}
}

func TestSerializeInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		m    Member
	}{
		{"integer too large", Member{Value: Integer(MaxInteger + 1)}},
		{"integer too small", Member{Value: Integer(-MaxInteger - 1)}},
		{"decimal too large", Member{Value: BareItem{Kind: KindDecimal, Int: MaxDecimalMilli + 1}}},
		{"string newline", Member{Value: String("a\nb")}},
		{"string non-ASCII", Member{Value: String("é")}},
		{"empty token", Member{Value: Token("")}},
		{"token digit first", Member{Value: Token("1a")}},
		{"token space", Member{Value: Token("a b")}},
		{"bad key", Member{Value: Integer(1), Params: Params{{Key: "Q", Value: Integer(1)}}}},
		{"empty key", Member{Value: Integer(1), Params: Params{{Key: "", Value: Integer(1)}}}},
		{"duplicate key", Member{Value: Integer(1), Params: Params{{Key: "a", Value: Integer(1)}, {Key: "a", Value: Integer(2)}}}},
		{"unknown kind", Member{Value: BareItem{Kind: 99}}},
		{"invalid UTF-8 display string", Member{Value: BareItem{Kind: KindDisplayString, Str: "\xff"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if s, err := SerializeList([]Member{tt.m}); err == nil {
				t.Errorf("SerializeList = %q, want an error", s)
			} else if !errors.Is(err, ErrSyntax) {
				t.Errorf("error %v does not wrap ErrSyntax", err)
			}
		})
	}
}

func TestSyntaxErrorOffset(t *testing.T) {
	t.Parallel()
	_, err := ParseList(`"a";q=1, "b";Q=2`)
	var se *SyntaxError
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a *SyntaxError", err)
	}
	if se.Offset != 13 {
		t.Errorf("offset = %d, want 13 (the 'Q')", se.Offset)
	}
	if !strings.Contains(se.Error(), "offset 13") {
		t.Errorf("message %q does not name the offset", se.Error())
	}
}

func TestKindString(t *testing.T) {
	t.Parallel()
	if got := KindByteSeq.String(); got != "byte sequence" {
		t.Errorf("KindByteSeq = %q", got)
	}
	if got := Kind(42).String(); got != "Kind(42)" {
		t.Errorf("Kind(42) = %q", got)
	}
}
