package headers

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file is a small, complete implementation of the List type of
// Structured Field Values for HTTP (RFC 9651, which obsoletes RFC 8941):
// parsing (Section 4.2) and serialization (Section 4.1) of Lists, Inner
// Lists, Parameters and every bare item type, Dates and Display Strings
// included. The RateLimit fields are Lists, so that is all this package
// needs; Dictionaries are not implemented.

// Kind is the type of a bare item.
type Kind uint8

// The bare item types of RFC 9651 Section 3.3.
const (
	KindInteger Kind = iota + 1
	KindDecimal
	KindString
	KindToken
	KindByteSeq
	KindBoolean
	KindDate
	KindDisplayString
)

var kindNames = [...]string{"", "integer", "decimal", "string", "token", "byte sequence", "boolean", "date", "display string"}

// String returns the RFC's name for the kind, e.g. "byte sequence".
func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// Limits of the structured field grammar.
const (
	// MaxInteger is the largest magnitude of an sf-integer (15 digits).
	MaxInteger = 999_999_999_999_999
	// MaxDecimalMilli is the largest magnitude of an sf-decimal, in
	// thousandths: 12 integer digits and 3 fractional ones.
	MaxDecimalMilli = 999_999_999_999_999
)

// BareItem is one bare item. Only the fields of its Kind are meaningful:
// Int for Integer and Date, Int as thousandths for Decimal (so decimals
// are exact), Str for String, Token and Display String, Bytes for Byte
// Sequence, and Bool for Boolean.
type BareItem struct {
	Kind  Kind
	Int   int64
	Str   string
	Bytes []byte
	Bool  bool
}

// Integer returns an Integer bare item.
func Integer(n int64) BareItem { return BareItem{Kind: KindInteger, Int: n} }

// String returns a String bare item.
func String(s string) BareItem { return BareItem{Kind: KindString, Str: s} }

// Token returns a Token bare item.
func Token(s string) BareItem { return BareItem{Kind: KindToken, Str: s} }

// ByteSeq returns a Byte Sequence bare item.
func ByteSeq(b []byte) BareItem { return BareItem{Kind: KindByteSeq, Bytes: b} }

// Boolean returns a Boolean bare item.
func Boolean(b bool) BareItem { return BareItem{Kind: KindBoolean, Bool: b} }

// Equal reports whether two bare items have the same kind and value.
func (b BareItem) Equal(o BareItem) bool {
	if b.Kind != o.Kind {
		return false
	}
	switch b.Kind {
	case KindInteger, KindDecimal, KindDate:
		return b.Int == o.Int
	case KindString, KindToken, KindDisplayString:
		return b.Str == o.Str
	case KindByteSeq:
		return string(b.Bytes) == string(o.Bytes)
	case KindBoolean:
		return b.Bool == o.Bool
	}
	return true
}

// Param is one parameter: a key and a bare item.
type Param struct {
	Key   string
	Value BareItem
}

// Params is an ordered set of parameters with unique keys.
type Params []Param

// Get returns the value of key and whether it is present.
func (ps Params) Get(key string) (BareItem, bool) {
	for _, p := range ps {
		if p.Key == key {
			return p.Value, true
		}
	}
	return BareItem{}, false
}

// set overwrites key's value in place, or appends it: RFC 9651 keeps the
// first position of a repeated key and the last value.
func (ps Params) set(key string, v BareItem) Params {
	for i := range ps {
		if ps[i].Key == key {
			ps[i].Value = v
			return ps
		}
	}
	return append(ps, Param{Key: key, Value: v})
}

// Member is one member of a List: an Item (Inner is nil) or an Inner List
// (IsInner is true; Value is unused).
type Member struct {
	Value   BareItem
	IsInner bool
	Inner   []Item
	Params  Params
}

// Item is a bare item with parameters.
type Item struct {
	Value  BareItem
	Params Params
}

// ErrSyntax is wrapped by every parse and serialization failure.
var ErrSyntax = errors.New("structured field syntax")

// SyntaxError reports where a field value breaks the grammar.
type SyntaxError struct {
	// Offset is the byte offset in the input where parsing failed.
	Offset int
	// Msg says what was expected.
	Msg string
}

// Error describes the failure and its offset.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("structured field syntax: %s at offset %d", e.Msg, e.Offset)
}

// Unwrap returns ErrSyntax.
func (e *SyntaxError) Unwrap() error { return ErrSyntax }

type parser struct {
	s   string
	pos int
}

func (p *parser) fail(format string, args ...any) error {
	return &SyntaxError{Offset: p.pos, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) empty() bool { return p.pos >= len(p.s) }

func (p *parser) peek() byte {
	if p.empty() {
		return 0
	}
	return p.s[p.pos]
}

func (p *parser) skipSP() {
	for !p.empty() && p.s[p.pos] == ' ' {
		p.pos++
	}
}

func (p *parser) skipOWS() {
	for !p.empty() && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

// ParseList parses a field value as a Structured Field List (RFC 9651
// Section 4.2.1). Several field lines of one field are combined first by
// joining them with ", ", as HTTP does. An empty value is an empty list.
func ParseList(lines ...string) ([]Member, error) {
	p := &parser{s: strings.Join(lines, ", ")}
	p.skipSP()
	var out []Member
	for !p.empty() {
		m, err := p.itemOrInnerList()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		p.skipOWS()
		if p.empty() {
			return out, nil
		}
		if p.s[p.pos] != ',' {
			return nil, p.fail("expected ',' after a list member, got %q", p.s[p.pos])
		}
		p.pos++
		p.skipOWS()
		if p.empty() {
			return nil, p.fail("trailing ',' in list")
		}
	}
	return out, nil
}

func (p *parser) itemOrInnerList() (Member, error) {
	if p.peek() == '(' {
		return p.innerList()
	}
	it, err := p.item()
	return Member{Value: it.Value, Params: it.Params}, err
}

func (p *parser) innerList() (Member, error) {
	p.pos++ // '('
	m := Member{IsInner: true, Inner: []Item{}}
	for !p.empty() {
		p.skipSP()
		if p.peek() == ')' {
			p.pos++
			ps, err := p.params()
			m.Params = ps
			return m, err
		}
		it, err := p.item()
		if err != nil {
			return m, err
		}
		m.Inner = append(m.Inner, it)
		if c := p.peek(); c != ' ' && c != ')' {
			return m, p.fail("expected ' ' or ')' in inner list")
		}
	}
	return m, p.fail("unterminated inner list")
}

func (p *parser) item() (Item, error) {
	v, err := p.bareItem()
	if err != nil {
		return Item{}, err
	}
	ps, err := p.params()
	return Item{Value: v, Params: ps}, err
}

func (p *parser) params() (Params, error) {
	var ps Params
	for p.peek() == ';' {
		p.pos++
		p.skipSP()
		k, err := p.key()
		if err != nil {
			return nil, err
		}
		v := Boolean(true)
		if p.peek() == '=' {
			p.pos++
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		ps = ps.set(k, v)
	}
	return ps, nil
}

func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || (c >= 'A' && c <= 'Z') }
func isDigit(c byte) bool   { return c >= '0' && c <= '9' }

func isKeyChar(c byte) bool {
	return isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*'
}

// isTChar reports whether c is a tchar of RFC 9110.
func isTChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func (p *parser) key() (string, error) {
	if c := p.peek(); !isLCAlpha(c) && c != '*' {
		return "", p.fail("a key must start with a lowercase letter or '*'")
	}
	start := p.pos
	for !p.empty() && isKeyChar(p.s[p.pos]) {
		p.pos++
	}
	return p.s[start:p.pos], nil
}

func (p *parser) bareItem() (BareItem, error) {
	c := p.peek()
	switch {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token(), nil
	case c == ':':
		return p.byteSeq()
	case c == '?':
		return p.boolean()
	case c == '@':
		p.pos++
		v, err := p.number()
		if err != nil {
			return v, err
		}
		if v.Kind != KindInteger {
			return v, p.fail("a date must be an integer")
		}
		v.Kind = KindDate
		return v, nil
	case c == '%':
		return p.displayString()
	case p.empty():
		return BareItem{}, p.fail("expected a bare item, got end of input")
	}
	return BareItem{}, p.fail("unexpected %q at the start of a bare item", c)
}

// number parses an sf-integer or an sf-decimal (RFC 9651 section 4.2.4).
func (p *parser) number() (BareItem, error) {
	neg := false
	if p.peek() == '-' {
		neg = true
		p.pos++
	}
	if !isDigit(p.peek()) {
		return BareItem{}, p.fail("expected a digit")
	}
	start, dot := p.pos, -1
	for !p.empty() {
		c := p.s[p.pos]
		if isDigit(c) {
			p.pos++
		} else if c == '.' && dot < 0 {
			if p.pos-start > 12 {
				return BareItem{}, p.fail("a decimal has at most 12 integer digits")
			}
			dot = p.pos
			p.pos++
		} else {
			break
		}
		if dot < 0 && p.pos-start > 15 {
			return BareItem{}, p.fail("an integer has at most 15 digits")
		}
		if dot >= 0 && p.pos-start > 16 {
			return BareItem{}, p.fail("a decimal has at most 16 characters")
		}
	}
	num := p.s[start:p.pos]
	if dot < 0 {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return BareItem{}, p.fail("bad integer %q", num)
		}
		if neg {
			n = -n
		}
		return Integer(n), nil
	}
	return p.decimal(start, dot, neg)
}

// decimal converts the decimal number scanned from start to the current
// position, its '.' at dot, to thousandths.
func (p *parser) decimal(start, dot int, neg bool) (BareItem, error) {
	frac := p.s[dot+1 : p.pos]
	if len(frac) == 0 {
		return BareItem{}, p.fail("a decimal must not end with '.'")
	}
	if len(frac) > 3 {
		return BareItem{}, p.fail("a decimal has at most 3 fractional digits")
	}
	ip, _ := strconv.ParseInt(p.s[start:dot], 10, 64)
	fp, _ := strconv.ParseInt(frac+strings.Repeat("0", 3-len(frac)), 10, 64)
	m := ip*1000 + fp
	if neg {
		m = -m
	}
	return BareItem{Kind: KindDecimal, Int: m}, nil
}

func (p *parser) str() (BareItem, error) {
	p.pos++ // '"'
	var b strings.Builder
	for !p.empty() {
		c := p.s[p.pos]
		p.pos++
		switch {
		case c == '\\':
			if p.empty() {
				return BareItem{}, p.fail("unterminated escape in string")
			}
			n := p.s[p.pos]
			p.pos++
			if n != '"' && n != '\\' {
				return BareItem{}, p.fail("only '\"' and '\\' may be escaped in a string")
			}
			b.WriteByte(n)
		case c == '"':
			return String(b.String()), nil
		case c < 0x20 || c > 0x7e:
			p.pos--
			return BareItem{}, p.fail("byte %#02x is not allowed in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return BareItem{}, p.fail("unterminated string")
}

func (p *parser) token() BareItem {
	start := p.pos
	p.pos++
	for !p.empty() {
		c := p.s[p.pos]
		if !isTChar(c) && c != ':' && c != '/' {
			break
		}
		p.pos++
	}
	return Token(p.s[start:p.pos])
}

func isBase64Char(c byte) bool {
	return isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '='
}

func (p *parser) byteSeq() (BareItem, error) {
	p.pos++ // ':'
	end := strings.IndexByte(p.s[p.pos:], ':')
	if end < 0 {
		return BareItem{}, p.fail("unterminated byte sequence")
	}
	content := p.s[p.pos : p.pos+end]
	for i := 0; i < len(content); i++ {
		if !isBase64Char(content[i]) {
			p.pos += i
			return BareItem{}, p.fail("byte %#02x is not base64", content[i])
		}
	}
	// Parsers may synthesize missing padding (Section 4.2.7).
	trimmed := strings.TrimRight(content, "=")
	b, err := base64.RawStdEncoding.DecodeString(trimmed)
	if err != nil {
		return BareItem{}, p.fail("bad base64 in byte sequence: %v", err)
	}
	p.pos += end + 1
	return ByteSeq(b), nil
}

func (p *parser) boolean() (BareItem, error) {
	p.pos++ // '?'
	switch p.peek() {
	case '1':
		p.pos++
		return Boolean(true), nil
	case '0':
		p.pos++
		return Boolean(false), nil
	}
	return BareItem{}, p.fail("a boolean is ?0 or ?1")
}

func isLCHex(c byte) bool { return isDigit(c) || (c >= 'a' && c <= 'f') }

func (p *parser) displayString() (BareItem, error) {
	p.pos++ // '%'
	if p.peek() != '"' {
		return BareItem{}, p.fail("expected '\"' after '%%'")
	}
	p.pos++
	var b []byte
	for !p.empty() {
		c := p.s[p.pos]
		switch {
		case c < 0x20 || c > 0x7e:
			return BareItem{}, p.fail("byte %#02x is not allowed in a display string", c)
		case c == '%':
			if p.pos+2 >= len(p.s) || !isLCHex(p.s[p.pos+1]) || !isLCHex(p.s[p.pos+2]) {
				return BareItem{}, p.fail("'%%' must be followed by two lowercase hex digits")
			}
			v, _ := strconv.ParseUint(p.s[p.pos+1:p.pos+3], 16, 8)
			b = append(b, byte(v))
			p.pos += 3
		case c == '"':
			p.pos++
			if !utf8.Valid(b) {
				return BareItem{}, p.fail("display string is not valid UTF-8")
			}
			return BareItem{Kind: KindDisplayString, Str: string(b)}, nil
		default:
			b = append(b, c)
			p.pos++
		}
	}
	return BareItem{}, p.fail("unterminated display string")
}
