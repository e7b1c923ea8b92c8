package main

import (
	"path/filepath"
	"testing"
)

// TestServeSettingsEnvoyRank checks the order docs/OPERATIONS.md ("Where
// settings come from") and serve's help give: envoyproxy/ratelimit's
// variables rank below the flags and FLEETRATE_* variables and above the
// file's server section; the configuration path is --config, then
// FLEETRATE_CONFIG, then RUNTIME_ROOT and its parts.
func TestServeSettingsEnvoyRank(t *testing.T) {
	t.Parallel()
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig) // http 127.0.0.1:1, grpc 127.0.0.1:2, log_level warn
	root := filepath.Dir(path)
	env := map[string]string{
		// envoyproxy/ratelimit's: the file is RUNTIME_ROOT/RUNTIME_APPDIRECTORY.
		"RUNTIME_ROOT":         root,
		"RUNTIME_APPDIRECTORY": filepath.Base(path),
		"PORT":                 "7",    // --http-addr :7, over the file's
		"GRPC_PORT":            "8",    // --grpc-addr :8, under FLEETRATE_GRPC_ADDR
		"LOG_LEVEL":            "info", // over the file's warn
		"FLEETRATE_GRPC_ADDR":  "127.0.0.1:9",
	}
	getenv := func(k string) string { return env[k] }
	cmd := serveCommand(getenv)
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	st, err := resolveSettings(cmd.Flags(), getenv)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"config: RUNTIME_ROOT over the default", st.configPath, path},
		{"http-addr: PORT over the file", st.httpAddr, ":7"},
		{"grpc-addr: FLEETRATE_GRPC_ADDR over GRPC_PORT", st.grpcAddr, "127.0.0.1:9"},
		{"log-level: LOG_LEVEL over the file", st.logLevel, "info"},
		{"max-wait: the file", st.maxWait.String(), "3s"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}

	// FLEETRATE_CONFIG ranks above RUNTIME_ROOT, and --config above both.
	other := serveWriteFile(t, "other.yaml", serveTestConfig)
	env["FLEETRATE_CONFIG"] = other
	if st, err = resolveSettings(serveCommand(getenv).Flags(), getenv); err != nil {
		t.Fatal(err)
	}
	if st.configPath != other {
		t.Errorf("config: got %s, want FLEETRATE_CONFIG's %s", st.configPath, other)
	}
	cmd = serveCommand(getenv)
	if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	if st, err = resolveSettings(cmd.Flags(), getenv); err != nil {
		t.Fatal(err)
	}
	if st.configPath != path {
		t.Errorf("config: got %s, want --config's %s", st.configPath, path)
	}
}
