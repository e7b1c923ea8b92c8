package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const (
	key1File = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"
	key2File = "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"
)

// TestEnvoyCaseMergeDomain covers merge_domain_key1.yaml and
// merge_domain_key2.yaml (MERGE_DOMAIN_CONFIG) and duplicate_domain.yaml:
// two files giving one domain merge when asked, and are rejected, naming
// both files, when not.
func TestEnvoyCaseMergeDomain(t *testing.T) {
	t.Parallel()
	dir := writeDir(t, map[string]string{"key1.yaml": key1File, "key2.yaml": key2File})
	cfg, err := LoadPath(dir, LoadOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Domain("test-domain")
	for _, e := range [][]Entry{entries("key1", "value1"), entries("key2", "value2")} {
		if d.Match(e).Rule == nil {
			t.Errorf("merged domain does not match %v", e)
		}
	}
	_, err = LoadPath(dir, LoadOptions{})
	want := filepath.Join(dir, "key2.yaml") + `:1: domain: duplicate domain "test-domain" (first on ` + filepath.Join(dir, "key1.yaml") + ":1)"
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "MERGE_DOMAIN_CONFIG") {
		t.Errorf("without merge: %v, want %q and the hint", err, want)
	}
	// A descriptor both files give is a duplicate even when merging.
	dup := writeDir(t, map[string]string{"a.yaml": key1File, "b.yaml": key1File})
	if _, err := LoadPath(dup, LoadOptions{MergeDomains: true}); err == nil || !strings.Contains(err.Error(), `b.yaml:3: descriptors[0]: duplicate descriptor "test-domain.key1_value1"`) {
		t.Errorf("merge with a duplicate descriptor: %v", err)
	}
}

// TestLoadDirectoryLayout covers envoyproxy/ratelimit's runtime layout:
// every file under the directory, subdirectories included, and dot files
// skipped with RUNTIME_IGNOREDOTFILES (as a Kubernetes ConfigMap's
// "..2024_01_01" directory must be).
func TestLoadDirectoryLayout(t *testing.T) {
	t.Parallel()
	dir := writeDir(t, map[string]string{
		"basic.yaml":              "domain: basic\n",
		"team/another.yml":        "domain: another\n",
		"..2030_01_01/basic.yaml": "domain: basic\n",
		".hidden":                 "not: yaml: at all",
	})
	cfg, err := LoadPath(dir, LoadOptions{IgnoreDotFiles: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := cfg.Summary(); len(got) != 2 || got[0] != "another" || got[1] != "basic" {
		t.Errorf("domains %v, want [another basic]", got)
	}
	h, err := Fingerprint(dir, LoadOptions{IgnoreDotFiles: true})
	if err != nil || h != cfg.Hash {
		t.Errorf("Fingerprint = %x, %v; want the loaded Hash %x", h, err, cfg.Hash)
	}
	if _, err := LoadPath(dir, LoadOptions{}); err == nil {
		t.Error("with dot files read, the second basic domain and the bad file must be rejected")
	}
	if _, err := LoadPath(filepath.Join(dir, "missing"), LoadOptions{}); err == nil {
		t.Error("a missing path loads")
	}
}
