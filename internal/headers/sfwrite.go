package headers

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// SerializeList serializes a List (RFC 9651 Section 4.1.1). It fails,
// wrapping ErrSyntax, when a value cannot be represented: an integer out
// of range, a string with a non-printable byte, a malformed token or key.
func SerializeList(members []Member) (string, error) {
	var b strings.Builder
	for i, m := range members {
		if i > 0 {
			b.WriteString(", ")
		}
		if m.IsInner {
			b.WriteByte('(')
			for j, it := range m.Inner {
				if j > 0 {
					b.WriteByte(' ')
				}
				if err := writeItem(&b, it.Value, it.Params); err != nil {
					return "", err
				}
			}
			b.WriteByte(')')
			if err := writeParams(&b, m.Params); err != nil {
				return "", err
			}
			continue
		}
		if err := writeItem(&b, m.Value, m.Params); err != nil {
			return "", err
		}
	}
	return b.String(), nil
}

func serr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSyntax, fmt.Sprintf(format, args...))
}

func writeItem(b *strings.Builder, v BareItem, ps Params) error {
	if err := writeBare(b, v); err != nil {
		return err
	}
	return writeParams(b, ps)
}

func writeParams(b *strings.Builder, ps Params) error {
	for i, p := range ps {
		if err := validKey(p.Key); err != nil {
			return err
		}
		for _, q := range ps[:i] {
			if q.Key == p.Key {
				return serr("duplicate parameter key %q", p.Key)
			}
		}
		b.WriteByte(';')
		b.WriteString(p.Key)
		if p.Value.Kind == KindBoolean && p.Value.Bool {
			continue
		}
		b.WriteByte('=')
		if err := writeBare(b, p.Value); err != nil {
			return err
		}
	}
	return nil
}

func validKey(k string) error {
	if k == "" || (!isLCAlpha(k[0]) && k[0] != '*') {
		return serr("key %q must start with a lowercase letter or '*'", k)
	}
	for i := 1; i < len(k); i++ {
		if !isKeyChar(k[i]) {
			return serr("key %q has the invalid byte %#02x", k, k[i])
		}
	}
	return nil
}

// ValidString reports whether s can be an sf-string: printable ASCII
// (%x20-7E) only.
func ValidString(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return serr("string %q has the non-printable or non-ASCII byte %#02x at %d", s, c, i)
		}
	}
	return nil
}

// writeBare serializes one bare item (RFC 9651 section 4.1.3), or says
// why v cannot be one.
func writeBare(b *strings.Builder, v BareItem) error {
	switch v.Kind {
	case KindInteger, KindDate:
		return writeInteger(b, v)
	case KindDecimal:
		return writeDecimal(b, v.Int)
	case KindString:
		return writeString(b, v.Str)
	case KindToken:
		return writeToken(b, v.Str)
	case KindByteSeq:
		b.WriteByte(':')
		b.WriteString(base64.StdEncoding.EncodeToString(v.Bytes))
		b.WriteByte(':')
	case KindBoolean:
		if v.Bool {
			b.WriteString("?1")
		} else {
			b.WriteString("?0")
		}
	case KindDisplayString:
		return writeDisplayString(b, v.Str)
	default:
		return serr("unknown bare item kind %d", v.Kind)
	}
	return nil
}

// writeInteger serializes an integer, or a date (an integer after '@').
func writeInteger(b *strings.Builder, v BareItem) error {
	if v.Int < -MaxInteger || v.Int > MaxInteger {
		return serr("%s %d is out of range ±%d", v.Kind, v.Int, int64(MaxInteger))
	}
	if v.Kind == KindDate {
		b.WriteByte('@')
	}
	b.WriteString(strconv.FormatInt(v.Int, 10))
	return nil
}

// writeDecimal serializes a decimal given in thousandths, with at most
// three fractional digits and no trailing zeros (but at least one digit).
func writeDecimal(b *strings.Builder, m int64) error {
	if m < -MaxDecimalMilli || m > MaxDecimalMilli {
		return serr("decimal %d/1000 is out of range", m)
	}
	if m < 0 {
		b.WriteByte('-')
		m = -m
	}
	b.WriteString(strconv.FormatInt(m/1000, 10))
	b.WriteByte('.')
	frac := fmt.Sprintf("%03d", m%1000)
	if frac = strings.TrimRight(frac, "0"); frac == "" {
		frac = "0"
	}
	b.WriteString(frac)
	return nil
}

// writeString serializes an sf-string: printable ASCII in quotes, with
// '"' and '\\' escaped.
func writeString(b *strings.Builder, s string) error {
	if err := ValidString(s); err != nil {
		return err
	}
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return nil
}

// writeToken serializes a token, which starts with a letter or '*'.
func writeToken(b *strings.Builder, t string) error {
	if t == "" || (!isAlpha(t[0]) && t[0] != '*') {
		return serr("token %q must start with a letter or '*'", t)
	}
	for i := 1; i < len(t); i++ {
		if !isTChar(t[i]) && t[i] != ':' && t[i] != '/' {
			return serr("token %q has the invalid byte %#02x", t, t[i])
		}
	}
	b.WriteString(t)
	return nil
}

// writeDisplayString serializes a display string: %"..." with '%', '"'
// and every byte outside printable ASCII percent-encoded.
func writeDisplayString(b *strings.Builder, s string) error {
	if !utf8.ValidString(s) {
		return serr("display string is not valid UTF-8")
	}
	b.WriteString(`%"`)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || c == '"' || c < 0x20 || c > 0x7e {
			fmt.Fprintf(b, "%%%02x", c)
			continue
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return nil
}
