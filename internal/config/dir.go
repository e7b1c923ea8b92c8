package config

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/fleetrate/fleetrate"
)

// MaxFiles bounds the files of a configuration directory.
const MaxFiles = 1000

// LoadOptions say how LoadPath reads a directory of files.
type LoadOptions struct {
	// MergeDomains merges a domain that several files give into one tree
	// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); a descriptor that two
	// files give is still a duplicate. When false, the second file giving
	// a domain is an error. The default is false, as there.
	MergeDomains bool
	// IgnoreDotFiles skips files and directories whose name starts with a
	// dot (envoyproxy/ratelimit's RUNTIME_IGNOREDOTFILES), such as the
	// "..data" entries of a Kubernetes ConfigMap volume. The default is
	// false, as there.
	IgnoreDotFiles bool
}

// LoadPath loads the file at path, or, when path is a directory, every
// file under it (subdirectories included, in lexical order of their paths)
// as one configuration, the way envoyproxy/ratelimit loads its runtime
// directory: each file holds domains, and a domain given by two files is
// an error unless opts.MergeDomains is set. Errors name the file and line.
func LoadPath(path string, opts LoadOptions) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: config: %w", fleetrate.ErrInvalid, err)
	}
	if !st.IsDir() {
		return LoadFile(path)
	}
	files, err := dirFiles(path, opts)
	if err != nil {
		return nil, err
	}
	cfg := newConfig(path, fingerprint(files))
	sh := &shared{merge: opts.MergeDomains}
	var problems, notices []Problem
	for _, f := range files {
		p := &parser{file: f.name, shared: sh}
		p.parse(f.data, cfg)
		problems = append(problems, p.errs...)
		notices = append(notices, p.notices...)
		if len(problems) >= maxProblems {
			break
		}
	}
	if len(problems) > 0 {
		return nil, &Error{Problems: problems}
	}
	cfg.Notices = notices
	return cfg, nil
}

// Fingerprint returns the Hash that LoadPath would give the configuration
// at path, reading it without parsing, so that a watcher can tell cheaply
// whether anything changed.
func Fingerprint(path string, opts LoadOptions) ([32]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return [32]byte{}, err
	}
	if !st.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return [32]byte{}, err
		}
		return sha256.Sum256(data), nil
	}
	files, err := dirFiles(path, opts)
	if err != nil {
		return [32]byte{}, err
	}
	return fingerprint(files), nil
}

type dirFile struct {
	name string // the path, for errors
	rel  string // the path under the directory
	data []byte
}

// dirFiles reads the files under dir. Symbolic links to files are
// followed; links to directories are not walked, so that a ConfigMap's
// "..data" link is not read twice.
func dirFiles(dir string, opts LoadOptions) ([]dirFile, error) {
	var files []dirFile
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir && opts.IgnoreDotFiles && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		st, err := os.Stat(path) // follows a link
		if err != nil || !st.Mode().IsRegular() {
			return nil // a dangling link, a socket: nothing to load
		}
		if len(files) == MaxFiles {
			return fmt.Errorf("more than %d files", MaxFiles)
		}
		data, err := readBounded(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		files = append(files, dirFile{name: path, rel: rel, data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: config directory %s: %w", fleetrate.ErrInvalid, dir, err)
	}
	return files, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxFileSize)
	}
	return data, nil
}

// fingerprint hashes the names and contents of a directory's files.
func fingerprint(files []dirFile) [32]byte {
	h := sha256.New()
	var n [8]byte
	for _, f := range files {
		for _, part := range [][]byte{[]byte(f.rel), f.data} {
			binary.BigEndian.PutUint64(n[:], uint64(len(part)))
			h.Write(n[:])
			h.Write(part)
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}
