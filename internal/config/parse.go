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

	"go.yaml.in/yaml/v3"

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
			p.upstreamChannels(cfg)
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

// document parses one YAML document: a domain with its descriptors,
// buckets, a server section, or any of them together.
func (p *parser) document(root *yaml.Node, cfg *Config) {
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return
		}
		root = root.Content[0]
	}
	pairs, ok := p.envoyMapping(root, "", "domain", "descriptors", "buckets", "upstreams", "server")
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
		case "upstreams":
			p.upstreams(kv.val, cfg)
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
	rl, rls, children, meta, quotas          *yaml.Node
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
		"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "in_flight", "quotas")
	if !ok {
		return descriptor{}, false
	}
	for _, kv := range pairs {
		if kv.key == "in_flight" {
			// Refused, not ignored: a bound that is not enforced is worse
			// than none.
			p.errorf(kv.knode, join(f, kv.key), "%s", errRLSInFlight)
			return descriptor{}, false
		}
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
		case "quotas":
			desc.quotas = kv.val
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
		if desc.quotas != nil {
			p.errorf(desc.quotas, join(f, "quotas"), "needs rate_limit or rate_limits beside it: the token bucket that smooths the minute")
		}
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
	if desc.quotas != nil {
		if r.Unlimited {
			p.errorf(desc.quotas, join(f, "quotas"), "must not be given when unlimited is true")
			return nil
		}
		var ok bool
		if r.Quotas, ok = p.quotas(desc.quotas, join(f, "quotas")); !ok {
			return nil
		}
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
