package docker_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Address pool of the networks compose creates (one per project). dockerd is started with no
// default bridge (--bridge=none), so nothing else on a private range is created.
const addressPool = "base=10.213.13.0/24,size=26"

// engine is the Docker engine the test uses: a CLI, a compose tool and, when the test had to
// start it, the dockerd it started.
type engine struct {
	docker  string   // docker CLI
	compose []string // "docker-compose" (v1) or "docker compose" (the v2 plugin)
	version string   // client and server versions, for the log
	cache   string   // base-image cache directory (debootstrap tarball, state.json, dockerd.log)
}

// cacheDir is where built base images' inputs and the run state are kept across runs:
// REBATCH_DOCKER_CACHE, else $XDG_CACHE_HOME/rebatchproxy/docker, else ~/.cache/rebatchproxy/docker.
func cacheDir(t *testing.T) string {
	d := os.Getenv("REBATCH_DOCKER_CACHE")
	if d == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			t.Fatalf("no cache directory: %v", err)
		}
		d = filepath.Join(base, "rebatchproxy", "docker")
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// run runs a command with a timeout and returns its combined output.
func run(timeout time.Duration, env []string, dir string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = env
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s %s: timed out after %v", name, strings.Join(args, " "), timeout)
	} else if err != nil {
		err = fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out.String(), err
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// lookPath finds a program on PATH or in the sbin directories Debian installs daemons in.
func lookPath(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/usr/bin", "/sbin", "/usr/local/bin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// ensureEngine returns a working Docker engine, installing Debian's docker.io, docker-compose
// and debootstrap when one is missing and starting dockerd when none answers. A dockerd the
// test started is stopped, by its pid, when the test ends. Anything that does not work fails
// the test.
func ensureEngine(t *testing.T) *engine {
	t.Helper()
	e := &engine{cache: cacheDir(t)}
	hasCompose := lookPath("docker-compose") != ""
	if lookPath("dockerd") == "" || lookPath("docker") == "" || !hasCompose || lookPath("debootstrap") == "" {
		installPackages(t)
	}
	e.docker = lookPath("docker")
	if e.docker == "" {
		t.Fatal("no docker CLI after installing docker.io")
	}
	if _, err := run(time.Minute, nil, "", e.docker, "compose", "version"); err == nil {
		e.compose = []string{e.docker, "compose"}
	} else if p := lookPath("docker-compose"); p != "" {
		e.compose = []string{p}
	} else {
		t.Fatal("no compose tool: neither `docker compose` nor docker-compose works")
	}
	if _, err := run(30*time.Second, nil, "", e.docker, "info"); err != nil {
		e.startDockerd(t)
	} else {
		t.Logf("docker: using the engine already running (not started by this test)")
	}
	v, err := run(30*time.Second, nil, "", e.docker, "version", "--format",
		"client {{.Client.Version}} (API {{.Client.APIVersion}}), server {{.Server.Version}} (API {{.Server.APIVersion}})")
	if err != nil {
		t.Fatalf("docker version: %v\n%s", err, v)
	}
	cv, _ := run(time.Minute, nil, "", e.compose[0], append(e.compose[1:], "version", "--short")...)
	e.version = strings.TrimSpace(v) + "; compose " + strings.TrimSpace(cv) + " (" + strings.Join(e.compose, " ") + ")"
	t.Logf("docker: %s", e.version)
	return e
}

// installPackages installs the Debian packages the test needs (as root: CI runs as root).
func installPackages(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("Docker is not installed and the test is not root: install docker.io, docker-compose and debootstrap (apt-get), or run as root")
	}
	pkgs := []string{"docker.io", "docker-compose", "debootstrap"}
	t0 := time.Now()
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	args := append([]string{"install", "-y", "-q", "--no-install-recommends"}, pkgs...)
	if _, err := run(15*time.Minute, env, "", "apt-get", args...); err != nil {
		// A stale package list is the usual reason; refresh it once.
		if o, err2 := run(10*time.Minute, env, "", "apt-get", "update", "-q"); err2 != nil {
			t.Fatalf("apt-get update: %v\n%s", err2, tail(o, 20))
		}
		if out, err := run(15*time.Minute, env, "", "apt-get", args...); err != nil {
			t.Fatalf("cannot install %v: %v\n%s", pkgs, err, tail(out, 30))
		}
	}
	t.Logf("docker: installed %v in %v", pkgs, time.Since(t0).Round(time.Second))
}

// startDockerd starts dockerd with no default bridge, no IP forwarding or masquerading (so
// containers reach only each other and the host's published ports) and the compose networks'
// address pool above, waits until it answers, and stops it by pid when the test ends.
func (e *engine) startDockerd(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("no Docker engine answers and the test is not root, so it cannot start dockerd")
	}
	dockerd := lookPath("dockerd")
	logPath := filepath.Join(e.cache, "dockerd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	pidfile := filepath.Join(e.cache, "dockerd.pid")
	cmd := exec.Command(dockerd, "--bridge=none", "--ip-forward=false", "--ip-masq=false",
		"--default-address-pool="+addressPool, "--pidfile="+pidfile, "--host=unix:///var/run/docker.sock")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("starting dockerd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			t.Logf("docker: stopped the dockerd this test started (pid %d)", cmd.Process.Pid)
		case <-time.After(45 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("dockerd (pid %d) did not stop within 45 s of SIGTERM; killed", cmd.Process.Pid)
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := run(10*time.Second, nil, "", e.docker, "info"); err == nil {
			break
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("dockerd exited at start (%v):\n%s", err, tail(string(log), 30))
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			t.Fatalf("dockerd did not answer within 90 s:\n%s", tail(string(log), 30))
		}
	}
	t.Logf("docker: started dockerd (pid %d, --bridge=none, pool %s) in %v; log %s",
		cmd.Process.Pid, addressPool, time.Since(t0).Round(time.Millisecond), logPath)
}

// dockerCmd runs the docker CLI (legacy builder: the BuildKit client, buildx, is not installed).
func (e *engine) dockerCmd(timeout time.Duration, args ...string) (string, error) {
	return run(timeout, append(os.Environ(), "DOCKER_BUILDKIT=0"), "", e.docker, args...)
}
