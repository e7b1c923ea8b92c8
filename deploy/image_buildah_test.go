package deploy

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var buildahImage = flag.Bool("image.buildah", false, "TestImageBuildah: build the Dockerfile with buildah, without a daemon or a registry, and run the image (several minutes)")

// localGoImage and localImage are the names TestImageBuildah builds.
const (
	localGoImage = "localhost/fleetrate-go:local"
	localImage   = "localhost/" + imageName
)

// TestImageBuildah builds the Dockerfile with buildah (no daemon:
// `--isolation chroot`, the vfs storage driver) and runs `fleetrate serve`
// from the image until its /healthz answers, as user 65532. This machine
// reaches no image registry, so the Dockerfile's two base images are
// replaced through its build arguments: GO_IMAGE by an image made here of
// the local Go toolchain, a static busybox (the shell RUN needs) and the
// CA certificates, whose module proxy is the local module cache, mounted
// read-only; BASE_IMAGE by scratch (the binary is static and the user
// numeric, so distroless adds only files the service does not read). It
// runs only with -image.buildah, and then fails, never skips, when a tool
// is missing:
//
//	apt-get install buildah busybox-static
//	go test -count=1 -run TestImageBuildah -v -timeout 30m ./deploy -args -image.buildah
func TestImageBuildah(t *testing.T) {
	if !*buildahImage {
		t.Skip("run with -args -image.buildah (needs buildah and busybox-static; several minutes)")
	}
	for _, tool := range []string{"buildah", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("-image.buildah needs %s: apt-get install buildah busybox-static", tool)
		}
	}
	busybox, _ := exec.LookPath("busybox")
	goroot := goEnv(t, "GOROOT")
	proxy := filepath.Join(goEnv(t, "GOMODCACHE"), "cache", "download")

	// The Go image: the local toolchain, a shell and the CA certificates.
	ctr := buildah(t, "from", "scratch")
	t.Cleanup(func() { _, _ = buildahOut("rm", ctr) })
	buildah(t, "copy", ctr, goroot, "/usr/local/go")
	buildah(t, "copy", ctr, busybox, "/bin/busybox")
	buildah(t, "copy", ctr, "/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt")
	buildah(t, "run", "--isolation", "chroot", ctr, "--", "/bin/busybox", "sh", "-c",
		"/bin/busybox --install -s /bin && mkdir -p /tmp && chmod 1777 /tmp")
	buildah(t, "config", "--env", "PATH=/usr/local/go/bin:/bin", "--env", "HOME=/root",
		"--env", "GOPROXY=file:///goproxy", "--env", "GOSUMDB=off", "--env", "GOTOOLCHAIN=local", ctr)
	buildah(t, "commit", "-q", ctr, localGoImage)

	// The Dockerfile itself, with the two bases swapped.
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	buildah(t, "bud", "--isolation", "chroot", "-v", proxy+":/goproxy:ro",
		"--build-arg", "GO_IMAGE="+localGoImage, "--build-arg", "BASE_IMAGE=scratch",
		"-t", localImage, "-f", filepath.Join(root, "Dockerfile"), root)
	if user := buildah(t, "inspect", "--format", "{{.OCIv1.Config.User}}", localImage); user != "65532:65532" {
		t.Errorf("the image runs as %q, want 65532:65532", user)
	}

	cfg, err := filepath.Abs("../examples/fleetrate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	run := buildah(t, "from", localImage)
	t.Cleanup(func() { _, _ = buildahOut("rm", run) })
	port := freePort(t)
	cmd := exec.Command("buildah", "run", "--isolation", "chroot", "-v", cfg+":/etc/fleetrate/fleetrate.yaml:ro", run, "--",
		"/usr/local/bin/fleetrate", "serve", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--grpc-addr", "off")
	cmd.Env = buildahEnv()
	runUntilHealthy(t, cmd, port)
}

// buildahEnv is the environment of every buildah call: the vfs storage
// driver, which needs no overlay mount.
func buildahEnv() []string { return append(os.Environ(), "STORAGE_DRIVER=vfs") }

func buildahOut(args ...string) (string, error) {
	cmd := exec.Command("buildah", args...)
	cmd.Env = buildahEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("buildah %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// buildah runs buildah with args and returns its output's last line.
func buildah(t *testing.T, args ...string) string {
	t.Helper()
	out, err := buildahOut(args...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	return lines[len(lines)-1]
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}
