package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetrate/fleetrate"
)

// Bounds on what a file may hold, so that a hostile or broken file costs
// bounded time and memory.
const (
	maxProblems = 50
	maxDepth    = 32
	maxNodes    = 1 << 20
	maxAlias    = 16
)

type parser struct {
	file    string
	errs    []Problem
	notices []Problem
	nodes   int
	// shared is what the files of one directory share.
	shared *shared
}

// shared is the state of a load that spans several files.
type shared struct {
	// merge merges a domain given by several files (MERGE_DOMAIN_CONFIG).
	merge bool
	// server locates the first server section, to reject a second.
	serverFile string
	serverLine int
	// domainFile names the file that first gave each domain.
	domainFile map[string]string
}

// where names a place in this file or another one: "line 3" or "a.yaml:3".
func (p *parser) where(file string, line int) string {
	if file == p.file {
		return fmt.Sprintf("line %d", line)
	}
	return fmt.Sprintf("%s:%d", file, line)
}

func (p *parser) errorf(n *yaml.Node, field, format string, args ...any) {
	if len(p.errs) >= maxProblems {
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	p.errs = append(p.errs, Problem{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
	if len(p.errs) == maxProblems {
		p.errs = append(p.errs, Problem{File: p.file, Msg: "too many errors; stopping"})
	}
}

// noticef records something the file says that is accepted but has no
// effect, so that the server can say so once when it loads the file.
func (p *parser) noticef(n *yaml.Node, field, format string, args ...any) {
	if len(p.notices) >= maxProblems {
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	p.notices = append(p.notices, Problem{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// envoyKeys are the field names envoyproxy/ratelimit accepts at any level
// of a file (it checks names, not where they stand, and then ignores a
// name that means nothing at its level).
var envoyKeys = []string{
	"domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit",
	"unlimited", "shadow_mode", "quota_mode", "name", "replaces", "detailed_metric",
	"value_to_metric", "share_threshold", "metadata",
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

func (p *parser) parse(data []byte, cfg *Config) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for doc := 1; ; doc++ {
		var root yaml.Node
		err := dec.Decode(&root)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			line, msg := 0, err.Error()
			if m := yamlLine.FindStringSubmatch(msg); m != nil {
				line, _ = strconv.Atoi(m[1])
				msg = m[2]
			}
			p.errs = append(p.errs, Problem{File: p.file, Line: line, Msg: "invalid YAML: " + msg})
			return
		}
		p.document(&root, cfg)
		if len(p.errs) >= maxProblems {
			return
		}
	}
}

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

// document parses one YAML document: a domain with its descriptors,
// buckets, a server section, or any of them together.
func (p *parser) document(root *yaml.Node, cfg *Config) {
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return
		}
		root = root.Content[0]
	}
	pairs, ok := p.envoyMapping(root, "", "domain", "descriptors", "buckets", "server")
	if !ok {
		return
	}
	var (
		domain            string
		domainNode, descs *yaml.Node
	)
	for _, kv := range pairs {
		switch kv.key {
		case "domain":
			domain, _ = p.str(kv.val, "domain")
			domainNode = kv.val
		case "descriptors":
			descs = kv.val
		case "buckets":
			p.buckets(kv.val, cfg)
		case "server":
			p.server(kv, cfg)
		}
	}
	if domainNode != nil || descs != nil {
		p.domain(root, domain, domainNode, descs, cfg)
	}
}

// server parses the server section, which one file of a load may give.
func (p *parser) server(kv pair, cfg *Config) {
	if sh := p.shared; sh.serverLine != 0 {
		p.errorf(kv.knode, "server", "given twice (first on %s)", p.where(sh.serverFile, sh.serverLine))
		return
	}
	p.shared.serverFile, p.shared.serverLine = p.file, kv.knode.Line
	p.settings(kv.val, &cfg.Settings)
}

// domain adds a document's domain and its descriptors to cfg, or, when
// domains are merged, adds the descriptors to the domain another file gave.
func (p *parser) domain(root *yaml.Node, name string, nameNode, descs *yaml.Node, cfg *Config) {
	if name == "" {
		n := nameNode
		if n == nil {
			n = root
		}
		p.errorf(n, "domain", "must not be empty")
		return
	}
	if old, ok := cfg.Domains[name]; ok {
		first := p.shared.domainFile[name]
		if !p.shared.merge || first == p.file {
			hint := ""
			if first != p.file {
				hint = " (set MERGE_DOMAIN_CONFIG=true or --merge-domains to merge them)"
			}
			p.errorf(nameNode, "domain", "duplicate domain %q (first on %s)%s", name, p.where(first, old.root.line), hint)
			return
		}
		// Merged: this file's descriptors join the domain's tree, and a
		// descriptor both files give is a duplicate, as in
		// envoyproxy/ratelimit.
		p.descriptors(descs, "descriptors", name, old, old.root, 1)
		return
	}
	d := &Domain{Name: name, root: newNode(nameNode.Line)}
	p.descriptors(descs, "descriptors", name, d, d.root, 1)
	cfg.Domains[name] = d
	if p.shared.domainFile == nil {
		p.shared.domainFile = map[string]string{}
	}
	p.shared.domainFile[name] = p.file
}

// descriptor is one entry of a descriptors list, as the file gives it.
type descriptor struct {
	key, value string
	// at is the key's node (or the entry's, when the key is missing): the
	// line errors about the entry name.
	at                                       *yaml.Node
	rl, rls, children, meta                  *yaml.Node
	shadow, quota, detailed, toMetric, share bool
}

// descriptors parses a descriptors list into the children of parent, and
// their own descriptors below them.
func (p *parser) descriptors(n *yaml.Node, field, parentID string, d *Domain, parent *node, depth int) {
	if n == nil {
		return
	}
	if depth > maxDepth {
		p.errorf(n, field, "descriptors nested deeper than %d levels", maxDepth)
		return
	}
	for i, item := range p.sequence(n, field) {
		f := fmt.Sprintf("%s[%d]", field, i)
		desc, ok := p.descriptorFields(item, f)
		if !ok {
			continue
		}
		id, child, ok := p.descriptorNode(desc, f, parentID, parent)
		if !ok {
			continue
		}
		if r := p.descriptorRule(desc, f, id); r != nil {
			child.rule = r
			d.Rules++
		}
		p.descriptors(desc.children, join(f, "descriptors"), id, d, child, depth+1)
	}
}

// descriptorFields reads the fields of one descriptor entry.
func (p *parser) descriptorFields(item *yaml.Node, f string) (descriptor, bool) {
	pairs, ok := p.envoyMapping(item, f, "key", "value", "rate_limit", "rate_limits", "descriptors",
		"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata")
	if !ok {
		return descriptor{}, false
	}
	desc := descriptor{at: item}
	for _, kv := range pairs {
		vf := join(f, kv.key)
		switch kv.key {
		case "key":
			desc.key, _ = p.str(kv.val, vf)
			desc.at = kv.val
		case "value":
			desc.value, _ = p.str(kv.val, vf)
		case "rate_limit":
			desc.rl = kv.val
		case "rate_limits":
			desc.rls = kv.val
		case "descriptors":
			desc.children = kv.val
		case "metadata":
			desc.meta = kv.val
		case "shadow_mode":
			desc.shadow, _ = p.boolean(kv.val, vf)
		case "quota_mode":
			desc.quota, _ = p.boolean(kv.val, vf)
		case "detailed_metric":
			desc.detailed, _ = p.boolean(kv.val, vf)
		case "value_to_metric":
			desc.toMetric, _ = p.boolean(kv.val, vf)
		case "share_threshold":
			desc.share, _ = p.boolean(kv.val, vf)
		}
	}
	if desc.key == "" {
		p.errorf(desc.at, join(f, "key"), "must not be empty")
		return desc, false
	}
	return desc, true
}

// descriptorNode adds the entry's node below parent and returns it with
// the entry's ID, as envoyproxy/ratelimit names it: parentID.key_value.
func (p *parser) descriptorNode(desc descriptor, f, parentID string, parent *node) (string, *node, bool) {
	wildcard := strings.Contains(desc.value, "*")
	if desc.share && !wildcard {
		p.errorf(desc.at, join(f, "share_threshold"), "needs a wildcard value (containing '*'), got value %q", desc.value)
	}
	composite := desc.key
	if desc.value != "" {
		composite += "_" + desc.value
	}
	id := parentID + "." + composite
	child := newNode(desc.at.Line)
	child.valueToMetric = desc.toMetric
	child.shareThreshold = desc.share && wildcard
	if prev := parent.add(desc.key, desc.value, child); prev != nil {
		p.errorf(desc.at, f, "duplicate descriptor %q (first on line %d)", id, prev.line)
		return "", nil, false
	}
	return id, child, true
}

// descriptorRule returns the entry's rule, or nil when it gives no limit
// or its limits have errors.
func (p *parser) descriptorRule(desc descriptor, f, id string) *Rule {
	if desc.rl == nil && desc.rls == nil {
		if desc.shadow {
			p.errorf(desc.at, join(f, "shadow_mode"), "has no effect without rate_limit")
		}
		if desc.quota {
			p.noticef(desc.at, join(f, "quota_mode"), "ignored: it has no effect without rate_limit")
		}
		if desc.meta != nil {
			p.noticef(desc.meta, join(f, "metadata"), "ignored: it has no effect without rate_limit")
		}
		return nil
	}
	r := &Rule{ID: id, ShadowMode: desc.shadow, QuotaMode: desc.quota, DetailedMetric: desc.detailed, File: p.file, Line: desc.at.Line}
	if desc.meta != nil {
		r.Metadata = p.metadata(desc.meta, join(f, "metadata"))
	}
	if !p.limits(desc.at, f, desc.rl, desc.rls, r, true) {
		return nil
	}
	return r
}

// limits parses the rate_limit block or the rate_limits list of the
// entry at f into r. envoy says whether its rate_limit is
// envoyproxy/ratelimit's, which may be unlimited, named and replace others.
func (p *parser) limits(at *yaml.Node, f string, rl, rls *yaml.Node, r *Rule, envoy bool) bool {
	switch {
	case rl != nil && rls != nil:
		p.errorf(at, f, "give rate_limit or rate_limits, not both")
		return false
	case rl != nil:
		return p.rateLimit(rl, join(f, "rate_limit"), r, envoy)
	case rls == nil:
		return true
	}
	good := true
	names := map[string]int{} // a limit's name: the index that gave it first
	for j, item := range p.sequence(rls, join(f, "rate_limits")) {
		n := len(r.Limits)
		good = p.rateLimit(item, fmt.Sprintf("%s.rate_limits[%d]", f, j), r, false) && good
		if len(r.Limits) == n || r.Limits[n].Name == "" {
			continue
		}
		// Headers and metrics name a limit by its name: two of one name
		// would be told apart by nothing (httplimit refuses them too).
		if first, dup := names[r.Limits[n].Name]; dup {
			p.errorf(item, fmt.Sprintf("%s.rate_limits[%d].name", f, j), "duplicate limit name %q (first in rate_limits[%d])", r.Limits[n].Name, first)
			good = false
			continue
		}
		names[r.Limits[n].Name] = j
	}
	if good && len(r.Limits) == 0 {
		p.errorf(rls, join(f, "rate_limits"), "must list at least one limit")
		return false
	}
	return good
}

// limitBlock is one rate_limit block, as the file gives it.
type limitBlock struct {
	spec                LimitSpec
	unitNode, burstNode *yaml.Node
	unlimited, burstSet bool
}

// rateLimit parses one rate_limit block into r. single is false inside a
// rate_limits list, where unlimited, name and replaces are not allowed.
func (p *parser) rateLimit(n *yaml.Node, field string, r *Rule, single bool) bool {
	lb, good := p.limitFields(n, field, r, single)
	at := p.deref(n)
	if single && r.Name != "" && slices.Contains(r.Replaces, r.Name) {
		p.errorf(at, join(field, "replaces"), "a rule cannot replace itself (%q)", r.Name)
		good = false
	}
	if !good {
		return false
	}
	if lb.unlimited {
		return p.unlimited(lb, field, r)
	}
	spec := lb.spec
	if spec.Unit == UnitUnknown {
		p.errorf(at, join(field, "unit"), "is required (second, minute, hour, day, week, month or year)")
		return false
	}
	if !lb.burstSet {
		spec.Burst = int64(spec.RequestsPerUnit)
	} else if spec.RequestsPerUnit == 0 {
		p.errorf(lb.burstNode, join(field, "burst"), "has no effect when requests_per_unit is 0 (which denies every request)")
		return false
	}
	if err := spec.Validate(); err != nil {
		p.errorf(at, field, "%s: %v", spec, err)
		return false
	}
	r.Limits = append(r.Limits, spec)
	return true
}

// unlimited makes r unlimited, unless the block also gives a unit or a
// burst.
func (p *parser) unlimited(lb limitBlock, field string, r *Rule) bool {
	if lb.unitNode != nil {
		p.errorf(lb.unitNode, join(field, "unit"), "must not be given when unlimited is true")
		return false
	}
	if lb.burstSet {
		p.errorf(lb.burstNode, join(field, "burst"), "must not be given when unlimited is true")
		return false
	}
	r.Unlimited = true
	return true
}

// limitFields reads the fields of one rate_limit block; its name and
// replaces go to r directly.
func (p *parser) limitFields(n *yaml.Node, field string, r *Rule, single bool) (limitBlock, bool) {
	allowed := []string{"unit", "requests_per_unit", "burst", "unit_multiplier", "name"}
	if single {
		allowed = append(allowed, "unlimited", "replaces")
	}
	// A single rate_limit is envoyproxy/ratelimit's, which is lenient.
	pairs, good := p.mappingOf(n, field, single, allowed)
	lb := limitBlock{spec: LimitSpec{UnitMultiplier: 1}}
	for _, kv := range pairs {
		f := join(field, kv.key)
		var (
			ok bool
			v  int64
		)
		switch kv.key {
		case "unit":
			lb.spec.Unit, ok = p.unit(kv.val, f)
			lb.unitNode = kv.val
		case "requests_per_unit":
			v, ok = p.integer(kv.val, f, 0, math.MaxUint32)
			lb.spec.RequestsPerUnit = uint32(v)
		case "unit_multiplier":
			v, ok = p.integer(kv.val, f, 1, math.MaxUint32)
			lb.spec.UnitMultiplier = uint32(v)
		case "burst":
			lb.spec.Burst, ok = p.integer(kv.val, f, 1, fleetrate.MaxBurst)
			lb.burstSet, lb.burstNode = true, kv.val
		case "unlimited":
			lb.unlimited, ok = p.boolean(kv.val, f)
		case "name":
			lb.spec.Name, ok = p.str(kv.val, f)
			if single {
				r.Name = lb.spec.Name
			}
		case "replaces":
			var names []string
			names, ok = p.replaces(kv.val, f)
			r.Replaces = append(r.Replaces, names...)
		}
		good = good && ok
	}
	return lb, good
}

// unit parses a unit name.
func (p *parser) unit(n *yaml.Node, f string) (Unit, bool) {
	s, ok := p.str(n, f)
	if !ok {
		return UnitUnknown, false
	}
	u, known := ParseUnit(s)
	if !known {
		p.errorf(n, f, "unknown unit %q (want second, minute, hour, day, week, month or year)", s)
		return UnitUnknown, false
	}
	return u, true
}

// replaces parses a rate_limit's replaces list: the names of the rules it
// replaces, each as {name: ...}.
func (p *parser) replaces(n *yaml.Node, f string) ([]string, bool) {
	var names []string
	good := true
	for i, item := range p.sequence(n, f) {
		rf := fmt.Sprintf("%s[%d]", f, i)
		rp, ok := p.envoyMapping(item, rf, "name")
		if !ok {
			good = false
			continue
		}
		name := ""
		for _, kv := range rp {
			name, _ = p.str(kv.val, join(rf, "name"))
		}
		if name == "" {
			p.errorf(item, join(rf, "name"), "must not be empty")
			good = false
			continue
		}
		names = append(names, name)
	}
	return names, good
}

// bucketEntry is one entry of the buckets list, as the file gives it.
type bucketEntry struct {
	name, channel, endpoint string
	hasName, hasChannel     bool
	rl, rls                 *yaml.Node
}

// buckets parses the buckets list into cfg.
func (p *parser) buckets(n *yaml.Node, cfg *Config) {
	for i, item := range p.sequence(n, "buckets") {
		f := fmt.Sprintf("buckets[%d]", i)
		if b, ok := p.bucket(item, f, cfg); ok {
			cfg.byName[b.Name] = len(cfg.Buckets)
			cfg.byName[b.Key] = len(cfg.Buckets)
			cfg.Buckets = append(cfg.Buckets, b)
		}
	}
}

// bucket parses one entry of the buckets list.
func (p *parser) bucket(item *yaml.Node, f string, cfg *Config) (Bucket, bool) {
	pairs, ok := p.mapping(item, f, "name", "channel", "endpoint", "rate_limit", "rate_limits")
	if !ok {
		return Bucket{}, false
	}
	var e bucketEntry
	for _, kv := range pairs {
		switch kv.key {
		case "name":
			e.name, _ = p.str(kv.val, join(f, "name"))
			e.hasName = true
		case "channel":
			e.channel, _ = p.str(kv.val, join(f, "channel"))
			e.hasChannel = true
		case "endpoint":
			e.endpoint, _ = p.str(kv.val, join(f, "endpoint"))
		case "rate_limit":
			e.rl = kv.val
		case "rate_limits":
			e.rls = kv.val
		}
	}
	at := p.deref(item)
	b, ok := p.bucketName(e, at, f, cfg)
	if !ok {
		return Bucket{}, false
	}
	r := &Rule{}
	switch {
	case !p.limits(at, f, e.rl, e.rls, r, false):
		return Bucket{}, false
	case len(r.Limits) == 0:
		p.errorf(at, f, "needs rate_limit or rate_limits with at least one limit")
		return Bucket{}, false
	case r.Denies():
		p.errorf(at, f, "requests_per_unit 0 is not allowed on a bucket")
		return Bucket{}, false
	}
	b.Limits = r.Limits
	return b, true
}

// bucketName checks the entry's name (or channel and endpoint) and
// returns the bucket it names, without limits.
func (p *parser) bucketName(e bucketEntry, at *yaml.Node, f string, cfg *Config) (Bucket, bool) {
	switch {
	case e.hasName && (e.hasChannel || e.endpoint != ""):
		p.errorf(at, f, "give name, or channel and endpoint, not both")
		return Bucket{}, false
	case e.hasName:
		e.channel, e.endpoint, _ = strings.Cut(e.name, "/")
	}
	if err := checkBucketPart(e.channel, false); err != nil {
		p.errorf(at, join(f, "channel"), "%v", err)
		return Bucket{}, false
	}
	if err := checkBucketPart(e.endpoint, true); err != nil {
		p.errorf(at, join(f, "endpoint"), "%v", err)
		return Bucket{}, false
	}
	b := Bucket{Channel: e.channel, Endpoint: e.endpoint, Name: e.channel, Key: BucketKey(e.channel, e.endpoint), File: p.file, Line: at.Line}
	if e.endpoint != "" {
		b.Name += "/" + e.endpoint
	}
	if len(b.Key) > fleetrate.MaxNameLen {
		p.errorf(at, f, "bucket name must be at most %d bytes, got %d", fleetrate.MaxNameLen, len(b.Key))
		return Bucket{}, false
	}
	if j, dup := cfg.byName[b.Name]; dup {
		p.errorf(at, f, "duplicate bucket %q (first on line %d)", b.Name, cfg.Buckets[j].Line)
		return Bucket{}, false
	}
	return b, true
}

// checkBucketPart validates a channel or endpoint name.
func checkBucketPart(s string, optional bool) error {
	switch {
	case s == "" && optional:
		return nil
	case s == "":
		return errors.New("must not be empty")
	case strings.ContainsAny(s, "{}"):
		return fmt.Errorf("must not contain { or }, got %q", s)
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("must not contain control characters, got %q", s)
	case !optional && strings.Contains(s, "/"):
		return fmt.Errorf("must not contain /, got %q", s)
	}
	return nil
}

// settings parses the server section into s. It is long because it is a
// table: each key names its field once, grouped by the parser of its
// type, and the loop that follows dispatches on the group.
func (p *parser) settings(n *yaml.Node, s *Settings) {
	strs := map[string]**string{
		"http_addr": &s.HTTPAddr, "grpc_addr": &s.GRPCAddr, "redis": &s.Redis, "prefix": &s.Prefix,
		"auth_token_file": &s.AuthTokenFile, "tls_cert_file": &s.TLSCertFile, "tls_key_file": &s.TLSKeyFile,
		"tls_client_ca_file": &s.TLSClientCAFile, "log_format": &s.LogFormat, "log_level": &s.LogLevel,
		"metrics_addr": &s.MetricsAddr, "metrics_path": &s.MetricsPath,
		"failure_policy": &s.FailurePolicy,
	}
	durs := map[string]**time.Duration{
		"max_wait": &s.MaxWait, "read_timeout": &s.ReadTimeout, "write_timeout": &s.WriteTimeout,
		"idle_timeout": &s.IdleTimeout, "shutdown_timeout": &s.ShutdownTimeout, "drain_delay": &s.DrainDelay, "store_timeout": &s.StoreTimeout,
		"reload_interval":  &s.ReloadInterval,
		"breaker_cool_off": &s.BreakerCoolOff,
	}
	bools := map[string]**bool{
		"response_headers": &s.ResponseHeaders, "shadow_mode": &s.ShadowMode, "store_api": &s.StoreAPI,
		"redis_batch": &s.RedisBatch, "health_checks_store": &s.HealthChecksStore, "tls_http": &s.TLSHTTP,
		"quota_mode": &s.QuotaMode, "adaptive_procs": &s.AdaptiveProcs, "response_dynamic_metadata": &s.ResponseDynamicMetadata,
	}
	type bounded struct {
		dst    **int64
		lo, hi int64
	}
	ints := map[string]bounded{
		"max_request_bytes": {&s.MaxRequestBytes, 1, 1 << 30},
		// The flags' bounds: any positive count (0 or more bytes for the
		// cache, where 0 is off).
		"memory_max_keys":        {&s.MemoryMaxKeys, 1, math.MaxInt64},
		"memory_max_bytes":       {&s.MemoryMaxBytes, 1, math.MaxInt64},
		"max_metric_descriptors": {&s.MaxMetricDescriptors, 1, math.MaxInt64},
		"local_cache_bytes":      {&s.LocalCacheBytes, 0, math.MaxInt64},
		"breaker_failures":       {&s.BreakerFailures, 1, math.MaxInt32},
		"fleet_size":             {&s.FleetSize, 1, math.MaxInt32},
		"max_in_flight":          {&s.MaxInFlight, 1, math.MaxInt64},
	}
	allowed := []string{"near_limit_ratio"}
	for k := range ints {
		allowed = append(allowed, k)
	}
	for k := range strs {
		allowed = append(allowed, k)
	}
	for k := range durs {
		allowed = append(allowed, k)
	}
	for k := range bools {
		allowed = append(allowed, k)
	}
	slices.Sort(allowed)
	pairs, _ := p.mapping(n, "server", allowed...)
	for _, kv := range pairs {
		f := join("server", kv.key)
		if dst, ok := strs[kv.key]; ok {
			if v, ok := p.str(kv.val, f); ok {
				*dst = &v
			}
		} else if dst, ok := durs[kv.key]; ok {
			if v, ok := p.duration(kv.val, f); ok {
				*dst = &v
			}
		} else if dst, ok := bools[kv.key]; ok {
			if v, ok := p.boolean(kv.val, f); ok {
				*dst = &v
			}
		} else if b, ok := ints[kv.key]; ok {
			if v, ok := p.integer(kv.val, f, b.lo, b.hi); ok {
				*b.dst = &v
			}
		} else if kv.key == "near_limit_ratio" {
			if v, ok := p.ratio(kv.val, f); ok {
				s.NearLimitRatio = &v
			}
		}
	}
}

// metadata parses a descriptor's metadata: any mapping, sent back to
// Envoy as dynamic metadata when the descriptor's limit applies and the
// request passes, as envoyproxy/ratelimit does.
func (p *parser) metadata(n *yaml.Node, field string) *structpb.Struct {
	n = p.deref(n)
	if n == nil {
		p.errorf(nil, field, "too deeply aliased")
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, field, "must be a mapping (key: value), got %s", kindName(n))
		return nil
	}
	var v map[string]any
	if err := n.Decode(&v); err != nil {
		p.errorf(n, field, "%v", err)
		return nil
	}
	st, err := structpb.NewStruct(plainMap(v))
	if err != nil {
		p.errorf(n, field, "%v", err)
		return nil
	}
	return st
}

// plainMap turns what YAML decoded into the types structpb takes: maps
// with string keys, lists, strings, numbers, booleans and null. Anything
// else (a timestamp, a map with non-string keys) becomes its text.
func plainMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = plainValue(v)
	}
	return out
}

func plainValue(v any) any {
	switch v := v.(type) {
	case nil, bool, string, int, int64, uint64, float64:
		return v
	case map[string]any:
		return plainMap(v)
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[fmt.Sprint(k)] = plainValue(x)
		}
		return m
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = plainValue(x)
		}
		return out
	}
	return fmt.Sprint(v)
}
