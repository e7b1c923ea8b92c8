package config

import (
	"strings"
)

// node is one level of a domain's descriptor tree.
type node struct {
	line    int
	rule    *Rule
	exact   map[Entry]*node
	keyOnly map[string]*node
	wild    []wildChild // in file order; the first match wins
	// valueToMetric puts the request's value in the metric label when this
	// node matched by key only or by wildcard.
	valueToMetric bool
	// shareThreshold makes every value matching this node's wildcard share
	// one bucket.
	shareThreshold bool
}

type wildChild struct {
	key, value string
	parts      []string // value split at each '*'
	n          *node
}

func newNode(line int) *node { return &node{line: line} }

// add registers child under key and value, and returns the node already
// registered there, if any.
func (n *node) add(key, value string, child *node) *node {
	if value == "" {
		if old := n.keyOnly[key]; old != nil {
			return old
		}
		if n.keyOnly == nil {
			n.keyOnly = map[string]*node{}
		}
		n.keyOnly[key] = child
		return nil
	}
	e := Entry{Key: key, Value: value}
	if old := n.exact[e]; old != nil {
		return old
	}
	if n.exact == nil {
		n.exact = map[Entry]*node{}
	}
	n.exact[e] = child
	if strings.Contains(value, "*") {
		n.wild = append(n.wild, wildChild{key: key, value: value, parts: strings.Split(value, "*"), n: child})
	}
	return nil
}

func (n *node) leaf() bool {
	return len(n.exact) == 0 && len(n.keyOnly) == 0
}

type matchKind int

const (
	byValue matchKind = iota
	byWildcard
	byKey
)

// child finds the child matching e: key and value first, then the first
// wildcard value (in file order) that the value matches, then the key
// alone, as envoyproxy/ratelimit does.
func (n *node) child(e Entry) (*node, matchKind, string) {
	if c := n.exact[e]; c != nil {
		return c, byValue, ""
	}
	for _, w := range n.wild {
		if w.key == e.Key && wildcardMatch(w.parts, e.Value) {
			return w.n, byWildcard, w.value
		}
	}
	if c := n.keyOnly[e.Key]; c != nil {
		return c, byKey, ""
	}
	return nil, 0, ""
}

// wildcardMatch reports whether value matches the pattern whose literal
// parts (the pattern split at each '*') are parts: each '*' stands for any
// run of bytes, empty included, as in envoyproxy/ratelimit. "foo*" is a
// prefix, "*bar" a suffix, "/api*v1" both, and "foo*bar*baz" also needs
// "bar" between them.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(parts) == 1 {
		return value == first
	}
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	// The middle parts must appear in order between the first and the last,
	// without overlapping either; taking each at its leftmost place leaves
	// the most room for the rest.
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// Entry is one key/value pair of a request's descriptor.
type Entry struct {
	Key, Value string
}

// Match is what a descriptor matched in a domain.
type Match struct {
	// Rule is the matched rule, or nil when the descriptor matches none
	// (then the request is not limited by it).
	Rule *Rule
	// Key identifies the descriptor's bucket, without the store prefix:
	// "rls:domain:key=value|key=value". Each distinct value of a key-only
	// or wildcard match gets a bucket of its own, except under
	// share_threshold, where the values matching one wildcard share one.
	Key string
	// Metric labels the descriptor in metrics: the rule's ID, or with
	// detailed_metric or value_to_metric the request's values.
	Metric string
}

// Match finds the rule for a descriptor, following envoyproxy/ratelimit:
// each entry descends one level of the tree, matching key and value
// exactly, else a wildcard value ("foo*", "/api*v1", "a*b*c"), else the key
// alone. A rule
// applies only when the descriptor has exactly as many entries as the
// path to the rule. A nil domain matches nothing.
func (d *Domain) Match(entries []Entry) Match {
	if d == nil || len(entries) == 0 {
		return Match{}
	}
	var key, metric, detailed strings.Builder
	// One allocation for each name, most of the time: a wildcard's
	// pattern or an escape can make a name longer.
	size := len(d.Name) + 8
	for _, e := range entries {
		size += len(e.Key) + len(e.Value) + 2
	}
	key.Grow(size)
	metric.Grow(size)
	detailed.Grow(size)
	key.WriteString("rls:")
	key.WriteString(escape(d.Name))
	key.WriteByte(':')
	metric.WriteString(d.Name)
	detailed.WriteString(d.Name)
	cur := d.root
	for i, e := range entries {
		next, kind, pattern := cur.child(e)
		if next == nil {
			return Match{}
		}
		if i > 0 {
			key.WriteByte('|')
		}
		key.WriteString(escape(e.Key))
		key.WriteByte('=')
		value := e.Value
		if kind == byWildcard && next.shareThreshold {
			value = pattern
		}
		key.WriteString(escape(value))
		writeMetricNames(&metric, &detailed, e, next, kind, pattern)
		if i == len(entries)-1 {
			if next.rule == nil {
				return Match{}
			}
			m := Match{Rule: next.rule, Key: key.String(), Metric: metric.String()}
			if next.rule.DetailedMetric {
				m.Metric = detailed.String()
			}
			return m
		}
		if next.leaf() {
			return Match{}
		}
		cur = next
	}
	return Match{}
}

// writeMetricNames appends entry e, matched to next by kind (pattern
// for a wildcard), to the rule's metric name and to its detailed one.
func writeMetricNames(metric, detailed *strings.Builder, e Entry, next *node, kind matchKind, pattern string) {
	suffix := func(b *strings.Builder, s string) {
		b.WriteByte('_')
		b.WriteString(s)
	}
	metric.WriteByte('.')
	metric.WriteString(e.Key)
	switch {
	case kind == byValue:
		suffix(metric, e.Value)
	case next.valueToMetric && e.Value != "" && !(kind == byWildcard && next.shareThreshold):
		suffix(metric, e.Value)
	case kind == byWildcard:
		suffix(metric, pattern)
	}
	detailed.WriteByte('.')
	detailed.WriteString(e.Key)
	if kind == byWildcard && next.shareThreshold {
		suffix(detailed, pattern)
	} else if e.Value != "" {
		suffix(detailed, e.Value)
	}
}

// escape percent-encodes the characters that delimit a bucket key, and
// Redis Cluster's hash-tag braces, so that distinct descriptors never
// share a key.
func escape(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', ':', '|', '=', '{', '}':
			b.WriteByte('%')
			b.WriteByte("0123456789ABCDEF"[c>>4])
			b.WriteByte("0123456789ABCDEF"[c&15])
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// needsEscape reports whether s holds a character escape encodes (a loop
// over the bytes: strings.ContainsAny builds a set on every call).
func needsEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '%', ':', '|', '=', '{', '}':
			return true
		}
	}
	return false
}

// Walk calls fn for every rule of the domain.
func (d *Domain) Walk(fn func(*Rule)) {
	if d != nil {
		d.root.walk(fn)
	}
}

func (n *node) walk(fn func(*Rule)) {
	if n.rule != nil {
		fn(n.rule)
	}
	for _, c := range n.exact {
		c.walk(fn)
	}
	for _, c := range n.keyOnly {
		c.walk(fn)
	}
}

// DescriptorKey returns the bucket key (without the store prefix) of a
// descriptor that carries its own limit override: each entry's key and
// value, as for a match by value.
func DescriptorKey(domain string, entries []Entry) string {
	var b strings.Builder
	b.WriteString("rls:")
	b.WriteString(escape(domain))
	b.WriteByte(':')
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(escape(e.Key))
		b.WriteByte('=')
		b.WriteString(escape(e.Value))
	}
	return b.String()
}
