package config

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// deref follows aliases and counts nodes, so that alias bombs stop early.
func (p *parser) deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i == maxAlias {
			return nil
		}
		n = n.Alias
	}
	p.nodes++
	return n
}

type pair struct {
	key   string
	knode *yaml.Node
	val   *yaml.Node
}

// mapping returns the pairs of a mapping node, rejecting keys that are not
// in allowed, duplicates and merge keys.
func (p *parser) mapping(n *yaml.Node, field string, allowed ...string) ([]pair, bool) {
	return p.mappingOf(n, field, false, allowed)
}

// envoyMapping is mapping for a level of envoyproxy/ratelimit's format: a
// name it accepts anywhere but that means nothing here is skipped with a
// notice instead of rejected, so that every file it loads loads here too.
func (p *parser) envoyMapping(n *yaml.Node, field string, allowed ...string) ([]pair, bool) {
	return p.mappingOf(n, field, true, allowed)
}

func (p *parser) mappingOf(n *yaml.Node, field string, lenient bool, allowed []string) ([]pair, bool) {
	n = p.deref(n)
	if n == nil || p.nodes > maxNodes {
		p.errorf(n, field, "document too large or too deeply aliased")
		return nil, false
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, true
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, field, "must be a mapping (key: value), got %s", kindName(n))
		return nil, false
	}
	out := make([]pair, 0, len(n.Content)/2)
	seen := map[string]bool{}
	// A bad key fails the mapping after the rest are read: its caller
	// then skips the checks across fields, which a misspelt one would
	// fail for no reason of its own (a burst without requests_per_unit).
	good := true
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := p.deref(n.Content[i])
		if k == nil || k.Kind != yaml.ScalarNode {
			p.errorf(n.Content[i], field, "keys must be plain strings")
			good = false
			continue
		}
		name := k.Value
		switch {
		case k.Tag == "!!merge":
			p.errorf(k, join(field, name), "merge keys (<<) are not supported")
			good = false
			continue
		case seen[name]:
			p.errorf(k, join(field, name), "given twice")
			good = false
			continue
		case !slices.Contains(allowed, name) && lenient && slices.Contains(envoyKeys, name):
			p.noticef(k, join(field, name), "ignored: it has no meaning at this level (envoyproxy/ratelimit ignores it here too)")
			continue
		case !slices.Contains(allowed, name):
			p.errorf(k, join(field, name), "unknown field (want one of %s)", strings.Join(allowed, ", "))
			good = false
			continue
		}
		seen[name] = true
		out = append(out, pair{key: name, knode: k, val: n.Content[i+1]})
	}
	return out, good
}

// sequence returns the items of a sequence node; null is an empty list.
func (p *parser) sequence(n *yaml.Node, field string) []*yaml.Node {
	n = p.deref(n)
	if n == nil || p.nodes > maxNodes {
		p.errorf(n, field, "document too large or too deeply aliased")
		return nil
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, field, "must be a list, got %s", kindName(n))
		return nil
	}
	return n.Content
}

func (p *parser) scalar(n *yaml.Node, field string) (*yaml.Node, bool) {
	n = p.deref(n)
	if n == nil {
		p.errorf(nil, field, "too deeply aliased")
		return nil, false
	}
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, field, "must be a single value, got %s", kindName(n))
		return nil, false
	}
	return n, true
}

func (p *parser) str(n *yaml.Node, field string) (string, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return "", false
	}
	if s.Tag == "!!null" {
		return "", true
	}
	return s.Value, true
}

func (p *parser) boolean(n *yaml.Node, field string) (bool, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return false, false
	}
	// YAML 1.1's spellings too, as envoyproxy/ratelimit's parser takes them.
	switch strings.ToLower(s.Value) {
	case "true", "yes", "y", "on":
		return true, true
	case "false", "no", "n", "off":
		return false, true
	}
	p.errorf(s, field, "must be true or false, got %q", s.Value)
	return false, false
}

func (p *parser) integer(n *yaml.Node, field string, lo, hi int64) (int64, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s.Value, 0, 64)
	if errors.Is(err, strconv.ErrRange) {
		p.errorf(s, field, "must be between %d and %d, got %s, which overflows", lo, hi, s.Value)
		return 0, false
	}
	if err != nil || s.Tag != "!!int" {
		p.errorf(s, field, "must be a whole number, got %q", s.Value)
		return 0, false
	}
	if v < lo || v > hi {
		p.errorf(s, field, "must be between %d and %d, got %d", lo, hi, v)
		return 0, false
	}
	return v, true
}

// ratio parses a number above 0 and at most 1.
func (p *parser) ratio(n *yaml.Node, field string) (float64, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(s.Value, 64)
	if err != nil || s.Tag != "!!float" && s.Tag != "!!int" || !(v > 0 && v <= 1) {
		p.errorf(s, field, "must be a number above 0 and at most 1, got %q", s.Value)
		return 0, false
	}
	return v, true
}

func (p *parser) duration(n *yaml.Node, field string) (time.Duration, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s.Value)
	if err != nil {
		p.errorf(s, field, "must be a duration such as 500ms, 5s or 1m, got %q", s.Value)
		return 0, false
	}
	if d < 0 {
		p.errorf(s, field, "must not be negative, got %v", d)
		return 0, false
	}
	return d, true
}

func kindName(n *yaml.Node) string {
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an alias"
}

func join(field, name string) string {
	if field == "" {
		return name
	}
	return field + "." + name
}
