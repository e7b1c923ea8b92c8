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
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := p.deref(n.Content[i])
		if k == nil || k.Kind != yaml.ScalarNode {
			p.errorf(n.Content[i], field, "keys must be plain strings")
			continue
		}
		name := k.Value
		switch {
		case k.Tag == "!!merge":
			p.errorf(k, join(field, name), "merge keys (<<) are not supported")
			continue
		case seen[name]:
			p.errorf(k, join(field, name), "given twice")
			continue
		case !slices.Contains(allowed, name) && lenient && slices.Contains(envoyKeys, name):
			p.noticef(k, join(field, name), "ignored: it has no meaning at this level (envoyproxy/ratelimit ignores it here too)")
			continue
		case !slices.Contains(allowed, name):
			p.errorf(k, join(field, name), "unknown field (want one of %s)", strings.Join(allowed, ", "))
			continue
		}
		seen[name] = true
		out = append(out, pair{key: name, knode: k, val: n.Content[i+1]})
	}
	return out, true
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
		domain     string
		domainNode *yaml.Node
		descs      *yaml.Node
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
			if sh := p.shared; sh.serverLine != 0 {
				p.errorf(kv.knode, "server", "given twice (first on %s)", p.where(sh.serverFile, sh.serverLine))
				continue
			}
			p.shared.serverFile, p.shared.serverLine = p.file, kv.knode.Line
			p.settings(kv.val, &cfg.Settings)
		}
	}
	if domainNode == nil && descs == nil {
		return
	}
	if domain == "" {
		n := domainNode
		if n == nil {
			n = root
		}
		p.errorf(n, "domain", "must not be empty")
		return
	}
	if old, ok := cfg.Domains[domain]; ok {
		first := p.shared.domainFile[domain]
		if !p.shared.merge || first == p.file {
			hint := ""
			if first != p.file {
				hint = " (set MERGE_DOMAIN_CONFIG=true or --merge-domains to merge them)"
			}
			p.errorf(domainNode, "domain", "duplicate domain %q (first on %s)%s", domain, p.where(first, old.root.line), hint)
			return
		}
		// Merged: this file's descriptors join the domain's tree, and a
		// descriptor both files give is a duplicate, as in
		// envoyproxy/ratelimit.
		p.descriptors(descs, "descriptors", domain, old, old.root, 1)
		return
	}
	d := &Domain{Name: domain, root: newNode(domainNode.Line)}
	p.descriptors(descs, "descriptors", domain, d, d.root, 1)
	cfg.Domains[domain] = d
	if p.shared.domainFile == nil {
		p.shared.domainFile = map[string]string{}
	}
	p.shared.domainFile[domain] = p.file
}

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
		pairs, ok := p.envoyMapping(item, f, "key", "value", "rate_limit", "rate_limits", "descriptors",
			"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata")
		if !ok {
			continue
		}
		var (
			key, value                        string
			keyNode                           *yaml.Node
			rl, rls, children, meta           *yaml.Node
			shadow, detailed, toMetric, share bool
			quota                             bool
		)
		for _, kv := range pairs {
			switch kv.key {
			case "key":
				key, _ = p.str(kv.val, join(f, "key"))
				keyNode = kv.val
			case "value":
				value, _ = p.str(kv.val, join(f, "value"))
			case "rate_limit":
				rl = kv.val
			case "rate_limits":
				rls = kv.val
			case "descriptors":
				children = kv.val
			case "shadow_mode":
				shadow, _ = p.boolean(kv.val, join(f, "shadow_mode"))
			case "quota_mode":
				quota, _ = p.boolean(kv.val, join(f, "quota_mode"))
			case "metadata":
				meta = kv.val
			case "detailed_metric":
				detailed, _ = p.boolean(kv.val, join(f, "detailed_metric"))
			case "value_to_metric":
				toMetric, _ = p.boolean(kv.val, join(f, "value_to_metric"))
			case "share_threshold":
				share, _ = p.boolean(kv.val, join(f, "share_threshold"))
			}
		}
		at := item
		if keyNode != nil {
			at = keyNode
		}
		if key == "" {
			p.errorf(at, join(f, "key"), "must not be empty")
			continue
		}
		wildcard := strings.Contains(value, "*")
		if share && !wildcard {
			p.errorf(at, join(f, "share_threshold"), "needs a wildcard value (containing '*'), got value %q", value)
		}
		composite := key
		if value != "" {
			composite += "_" + value
		}
		id := parentID + "." + composite
		child := newNode(at.Line)
		child.valueToMetric = toMetric
		child.shareThreshold = share && wildcard
		if prev := parent.add(key, value, child); prev != nil {
			p.errorf(at, f, "duplicate descriptor %q (first on line %d)", id, prev.line)
			continue
		}
		if rl != nil && rls != nil {
			p.errorf(at, f, "give rate_limit or rate_limits, not both")
		}
		if rl != nil || rls != nil {
			r := &Rule{ID: id, ShadowMode: shadow, QuotaMode: quota, DetailedMetric: detailed, File: p.file, Line: at.Line}
			if meta != nil {
				r.Metadata = p.metadata(meta, join(f, "metadata"))
			}
			ok := true
			if rl != nil {
				ok = p.rateLimit(rl, join(f, "rate_limit"), r, true)
			} else {
				for j, item := range p.sequence(rls, join(f, "rate_limits")) {
					if !p.rateLimit(item, fmt.Sprintf("%s.rate_limits[%d]", f, j), r, false) {
						ok = false
					}
				}
				if len(r.Limits) == 0 && ok {
					p.errorf(rls, join(f, "rate_limits"), "must list at least one limit")
					ok = false
				}
			}
			if ok {
				child.rule = r
				d.Rules++
			}
		} else {
			if shadow {
				p.errorf(at, join(f, "shadow_mode"), "has no effect without rate_limit")
			}
			if quota {
				p.noticef(at, join(f, "quota_mode"), "ignored: it has no effect without rate_limit")
			}
			if meta != nil {
				p.noticef(meta, join(f, "metadata"), "ignored: it has no effect without rate_limit")
			}
		}
		p.descriptors(children, join(f, "descriptors"), id, d, child, depth+1)
	}
}

// rateLimit parses one rate_limit block into r. single is false inside a
// rate_limits list, where unlimited, name and replaces are not allowed.
func (p *parser) rateLimit(n *yaml.Node, field string, r *Rule, single bool) bool {
	allowed := []string{"unit", "requests_per_unit", "burst", "unit_multiplier", "name"}
	if single {
		allowed = append(allowed, "unlimited", "replaces")
	}
	var (
		pairs []pair
		ok    bool
	)
	if single {
		pairs, ok = p.envoyMapping(n, field, allowed...)
	} else {
		pairs, ok = p.mapping(n, field, allowed...)
	}
	if !ok {
		return false
	}
	spec := LimitSpec{UnitMultiplier: 1}
	var (
		unitNode, burstNode *yaml.Node
		unlimited, good     = false, true
		burstSet            bool
	)
	at := p.deref(n)
	for _, kv := range pairs {
		f := join(field, kv.key)
		switch kv.key {
		case "unit":
			s, ok := p.str(kv.val, f)
			if !ok {
				good = false
				continue
			}
			unitNode = kv.val
			u, known := ParseUnit(s)
			if !known {
				p.errorf(kv.val, f, "unknown unit %q (want second, minute, hour, day, week, month or year)", s)
				good = false
				continue
			}
			spec.Unit = u
		case "requests_per_unit":
			v, ok := p.integer(kv.val, f, 0, math.MaxUint32)
			good = good && ok
			spec.RequestsPerUnit = uint32(v)
		case "unit_multiplier":
			v, ok := p.integer(kv.val, f, 1, math.MaxUint32)
			good = good && ok
			spec.UnitMultiplier = uint32(v)
		case "burst":
			v, ok := p.integer(kv.val, f, 1, fleetrate.MaxBurst)
			good = good && ok
			spec.Burst, burstSet, burstNode = v, true, kv.val
		case "unlimited":
			v, ok := p.boolean(kv.val, f)
			good = good && ok
			unlimited = v
		case "name":
			s, ok := p.str(kv.val, f)
			good = good && ok
			spec.Name = s
			if single {
				r.Name = s
			}
		case "replaces":
			for i, item := range p.sequence(kv.val, f) {
				rf := fmt.Sprintf("%s[%d]", f, i)
				rp, ok := p.envoyMapping(item, rf, "name")
				if !ok {
					good = false
					continue
				}
				name := ""
				for _, kv := range rp {
					if kv.key == "name" {
						name, _ = p.str(kv.val, join(rf, "name"))
					}
				}
				if name == "" {
					p.errorf(item, join(rf, "name"), "must not be empty")
					good = false
					continue
				}
				r.Replaces = append(r.Replaces, name)
			}
		}
	}
	if single && r.Name != "" && slices.Contains(r.Replaces, r.Name) {
		p.errorf(at, join(field, "replaces"), "a rule cannot replace itself (%q)", r.Name)
		good = false
	}
	if !good {
		return false
	}
	if unlimited {
		if unitNode != nil {
			p.errorf(unitNode, join(field, "unit"), "must not be given when unlimited is true")
			return false
		}
		if burstSet {
			p.errorf(burstNode, join(field, "burst"), "must not be given when unlimited is true")
			return false
		}
		r.Unlimited = true
		return true
	}
	if spec.Unit == UnitUnknown {
		p.errorf(at, join(field, "unit"), "is required (second, minute, hour, day, week, month or year)")
		return false
	}
	if !burstSet {
		spec.Burst = int64(spec.RequestsPerUnit)
	} else if spec.RequestsPerUnit == 0 {
		p.errorf(burstNode, join(field, "burst"), "has no effect when requests_per_unit is 0 (which denies every request)")
		return false
	}
	if err := spec.Validate(); err != nil {
		p.errorf(at, field, "%s: %v", spec, err)
		return false
	}
	r.Limits = append(r.Limits, spec)
	return true
}

func (p *parser) buckets(n *yaml.Node, cfg *Config) {
	for i, item := range p.sequence(n, "buckets") {
		f := fmt.Sprintf("buckets[%d]", i)
		pairs, ok := p.mapping(item, f, "name", "channel", "endpoint", "rate_limit", "rate_limits")
		if !ok {
			continue
		}
		var (
			name, channel, endpoint string
			rl, rls                 *yaml.Node
			hasName, hasChannel     bool
		)
		for _, kv := range pairs {
			switch kv.key {
			case "name":
				name, _ = p.str(kv.val, join(f, "name"))
				hasName = true
			case "channel":
				channel, _ = p.str(kv.val, join(f, "channel"))
				hasChannel = true
			case "endpoint":
				endpoint, _ = p.str(kv.val, join(f, "endpoint"))
			case "rate_limit":
				rl = kv.val
			case "rate_limits":
				rls = kv.val
			}
		}
		at := p.deref(item)
		switch {
		case hasName && (hasChannel || endpoint != ""):
			p.errorf(at, f, "give name, or channel and endpoint, not both")
			continue
		case hasName:
			channel, endpoint, _ = strings.Cut(name, "/")
		}
		if err := checkBucketPart(channel, false); err != nil {
			p.errorf(at, join(f, "channel"), "%v", err)
			continue
		}
		if err := checkBucketPart(endpoint, true); err != nil {
			p.errorf(at, join(f, "endpoint"), "%v", err)
			continue
		}
		b := Bucket{Channel: channel, Endpoint: endpoint, Name: channel, Key: BucketKey(channel, endpoint), File: p.file, Line: at.Line}
		if endpoint != "" {
			b.Name += "/" + endpoint
		}
		if len(b.Key) > fleetrate.MaxNameLen {
			p.errorf(at, f, "bucket name must be at most %d bytes, got %d", fleetrate.MaxNameLen, len(b.Key))
			continue
		}
		if j, dup := cfg.byName[b.Name]; dup {
			p.errorf(at, f, "duplicate bucket %q (first on line %d)", b.Name, cfg.Buckets[j].Line)
			continue
		}
		r := &Rule{}
		good := true
		switch {
		case rl != nil && rls != nil:
			p.errorf(at, f, "give rate_limit or rate_limits, not both")
			good = false
		case rl != nil:
			good = p.rateLimit(rl, join(f, "rate_limit"), r, false)
		case rls != nil:
			for j, item := range p.sequence(rls, join(f, "rate_limits")) {
				if !p.rateLimit(item, fmt.Sprintf("%s.rate_limits[%d]", f, j), r, false) {
					good = false
				}
			}
		}
		if !good {
			continue
		}
		if len(r.Limits) == 0 {
			p.errorf(at, f, "needs rate_limit or rate_limits with at least one limit")
			continue
		}
		if r.Denies() {
			p.errorf(at, f, "requests_per_unit 0 is not allowed on a bucket")
			continue
		}
		b.Limits = r.Limits
		cfg.byName[b.Name] = len(cfg.Buckets)
		cfg.byName[b.Key] = len(cfg.Buckets)
		cfg.Buckets = append(cfg.Buckets, b)
	}
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

func (p *parser) settings(n *yaml.Node, s *Settings) {
	strs := map[string]**string{
		"http_addr": &s.HTTPAddr, "grpc_addr": &s.GRPCAddr, "redis": &s.Redis, "prefix": &s.Prefix,
		"auth_token_file": &s.AuthTokenFile, "tls_cert_file": &s.TLSCertFile, "tls_key_file": &s.TLSKeyFile,
		"tls_client_ca_file": &s.TLSClientCAFile, "log_format": &s.LogFormat, "log_level": &s.LogLevel,
	}
	durs := map[string]**time.Duration{
		"max_wait": &s.MaxWait, "read_timeout": &s.ReadTimeout, "write_timeout": &s.WriteTimeout,
		"idle_timeout": &s.IdleTimeout, "shutdown_timeout": &s.ShutdownTimeout, "drain_delay": &s.DrainDelay, "store_timeout": &s.StoreTimeout,
		"reload_interval": &s.ReloadInterval,
	}
	bools := map[string]**bool{
		"response_headers": &s.ResponseHeaders, "shadow_mode": &s.ShadowMode, "store_api": &s.StoreAPI,
		"redis_batch": &s.RedisBatch,
	}
	allowed := []string{"max_request_bytes"}
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
		} else if kv.key == "max_request_bytes" {
			if v, ok := p.integer(kv.val, f, 1, 1<<30); ok {
				s.MaxRequestBytes = &v
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
