package deploy

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// imageName is the build docs/OPERATIONS.md and the Dockerfile's header
// describe; the Kubernetes manifests name it.
const imageName = "fleetrate:dev"

// TestDockerfile checks the image's recipe: a multi-stage build of a
// static ./cmd/fleetrate into a non-root final image, and manifests that
// name the image the documented command builds.
func TestDockerfile(t *testing.T) {
	src, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(src)
	if n := len(regexp.MustCompile(`(?m)^FROM `).FindAllString(df, -1)); n < 2 {
		t.Errorf("the Dockerfile has %d stages, want a build stage and a final one", n)
	}
	if !strings.Contains(df, "CGO_ENABLED=0 go build") || !strings.Contains(df, "./cmd/fleetrate") {
		t.Error("the Dockerfile does not build ./cmd/fleetrate with CGO_ENABLED=0")
	}
	final := df[strings.LastIndex(df, "\nFROM "):]
	if !regexp.MustCompile(`(?m)^USER [1-9][0-9]*(:[1-9][0-9]*)?$`).MatchString(final) {
		t.Error("the final stage has no numeric non-root USER")
	}
	if !strings.Contains(df, "docker build -t "+imageName+" .") {
		t.Errorf("the Dockerfile's header does not give the build command for %s", imageName)
	}
	manifest, err := os.ReadFile("kubernetes/envoy-ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`image:\s*(\S+)`).FindAllStringSubmatch(string(manifest), -1) {
		if m[1] != imageName {
			t.Errorf("deploy/kubernetes names image %s, want %s, the image the Dockerfile builds", m[1], imageName)
		}
	}
}

// TestImageBinary builds the binary as the Dockerfile does, checks that it
// is static (so it runs on a distroless or scratch base), and runs
// `fleetrate serve` from it until its health endpoint answers. The image
// itself is built by TestImage, where a Docker daemon can pull the base
// images, and by TestImageBuildah (-image.buildah), offline.
func TestImageBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "fleetrate")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/fleetrate")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary is dynamically linked: it would not run on a distroless static base")
		}
	}
	cfg, err := filepath.Abs("../examples/fleetrate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cmd := exec.Command(bin, "serve", "--config", cfg, "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--grpc-addr", "off")
	cmd.Dir = t.TempDir()
	runUntilHealthy(t, cmd, port)
}

// TestImage builds the image with Docker and runs `fleetrate serve` in it
// until its health endpoint answers. It needs a Docker daemon that can
// pull golang and gcr.io/distroless; without one it skips, saying so.
func TestImage(t *testing.T) {
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("no docker in PATH: build the image by hand with `docker build -t " + imageName + " .`")
	}
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		t.Skipf("no Docker daemon (%v): build the image by hand with `docker build -t %s .`\n%s", err, imageName, firstLine(out))
	}
	build := exec.Command("docker", "build", "-t", imageName, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	cfg, err := filepath.Abs("../examples/fleetrate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	name := fmt.Sprintf("fleetrate-test-%d", port)
	cmd := exec.Command("docker", "run", "--rm", "--name", name, "-p", fmt.Sprintf("127.0.0.1:%d:8080", port),
		"-v", cfg+":/etc/fleetrate/fleetrate.yaml:ro", imageName)
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", name).Run() })
	runUntilHealthy(t, cmd, port)
}

// runUntilHealthy starts cmd, polls GET /healthz on port until it answers
// 200 (within a minute: a loaded machine starts slowly), and stops cmd.
func runUntilHealthy(t *testing.T, cmd *exec.Cmd, port int) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
		}
	}()
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		<-done
		_ = cmd.Wait()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", port)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("GET %s did not answer 200 within a minute; the service's log:\n%s", url, log.String())
		case <-tick.C:
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
