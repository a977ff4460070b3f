package drivers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Bounds for the preparation steps (a cold cache downloads and compiles; a warm one does nothing).
const (
	goBuildTimeout   = 10 * time.Minute
	mavenTimeout     = 10 * time.Minute
	javacTimeout     = 3 * time.Minute
	pipTimeout       = 10 * time.Minute
	cargoTimeout     = 10 * time.Minute
	toolProbeTimeout = 30 * time.Second
)

// Prepare builds or installs the driver if its cache entry is missing or stale. It is cheap when
// everything is cached (hashing a few files). Safe to call concurrently, also across processes.
func (d *Driver) Prepare(ctx context.Context) error {
	_, err := d.prepared(ctx)
	return err
}

// prepared returns the command prefix that runs the driver, preparing it on first use.
func (d *Driver) prepared(ctx context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.argv != nil {
		return d.argv, nil
	}
	src, err := SourceDir()
	if err != nil {
		return nil, err
	}
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cache, "locks"), 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockFile(ctx, filepath.Join(cache, "locks", d.Name+".lock"))
	if err != nil {
		return nil, fmt.Errorf("drivers: %s: %w", d.Name, err)
	}
	defer unlock()
	var argv []string
	switch d.Client {
	case "go":
		argv, err = d.prepareGo(ctx, cache)
	case "java":
		argv, err = d.prepareJava(ctx, src, cache)
	case "python":
		argv, err = d.preparePython(ctx, src, cache)
	case "rust":
		argv, err = d.prepareRust(ctx, src, cache)
	default:
		err = fmt.Errorf("unknown client kind %q", d.Client)
	}
	if err != nil {
		return nil, fmt.Errorf("drivers: prepare %s: %w", d.Name, err)
	}
	d.argv = argv
	return argv, nil
}

// lockFile takes an exclusive flock, polling so that ctx bounds the wait.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// need returns the path of tool or an error naming it.
func need(tool, why string) (string, error) {
	p, err := exec.LookPath(tool)
	if err != nil {
		return "", fmt.Errorf("missing tool %q on PATH (%s)", tool, why)
	}
	return p, nil
}

var networkHints = regexp.MustCompile(`(?i)dial tcp|no such host|connection refused|connection reset|` +
	`i/o timeout|could not transfer|could not resolve|unknownhost|newconnectionerror|max retries exceeded|` +
	`temporary failure in name resolution|network is unreachable|tls handshake`)

// runStep runs one preparation command with a bound, returning its combined output tail on failure,
// naming the network when the output looks like a download failure.
func runStep(ctx context.Context, limit time.Duration, dir string, env []string, registry string,
	name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	out := &tailBuffer{max: 6 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	if os.Getenv("DRIVERS_VERBOSE") != "" {
		cmd.Stdout = io.MultiWriter(out, os.Stderr)
		cmd.Stderr = cmd.Stdout
	}
	err := cmd.Run()
	if err == nil {
		return nil
	}
	what := filepath.Base(name) + " " + strings.Join(args, " ")
	if ctx.Err() != nil {
		return fmt.Errorf("%s: timed out after %v\n%s", what, limit, out.String())
	}
	if registry != "" && networkHints.MatchString(out.String()) {
		return fmt.Errorf("%s failed; the network (%s) looks unreachable: %v\n%s", what, registry, err, out.String())
	}
	return fmt.Errorf("%s: %v\n%s", what, err, out.String())
}

// hashFiles hashes names and contents (following symlinks) plus extra strings.
func hashFiles(files []string, extra ...string) (string, error) {
	h := sha256.New()
	for _, e := range extra {
		fmt.Fprintf(h, "extra %q\n", e)
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "file %q %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func toolIdentity(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %d %d", real, st.Size(), st.ModTime().UnixNano()), nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// copyFile copies src to a new file dst with mode perm.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// publishEntry makes the cache entry dir: fill writes it into a fresh dir+".tmp", which is
// then renamed into place, so that an entry exists only once complete (a build killed halfway
// leaves only a .tmp, redone next time). The other entries matching the glob stale ("" matches
// none) are then deleted.
func publishEntry(dir, stale string, fill func(tmp string) error) error {
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	if err := fill(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	removeOthers(stale, dir)
	return nil
}

// removeOthers deletes stale cache entries matching glob except keep.
func removeOthers(glob, keep string) {
	old, _ := filepath.Glob(glob)
	for _, o := range old {
		if o != keep {
			_ = os.RemoveAll(o)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Go: one module per version, built once per source hash.

func (d *Driver) prepareGo(ctx context.Context, cache string) ([]string, error) {
	goTool, err := need("go", "builds the pulsar-client-go drivers")
	if err != nil {
		return nil, err
	}
	vctx, cancel := context.WithTimeout(ctx, toolProbeTimeout)
	defer cancel()
	gv, err := exec.CommandContext(vctx, goTool, "env", "GOVERSION").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOVERSION: %w", err)
	}
	entries, err := os.ReadDir(d.goDir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") || n == "go.mod" || n == "go.sum" {
			files = append(files, filepath.Join(d.goDir, n))
		}
	}
	hash, err := hashFiles(files, strings.TrimSpace(string(gv)), d.Name)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, "go", d.Name+"-"+hash)
	bin := filepath.Join(dir, "driver")
	if exists(bin) {
		return []string{bin}, nil
	}
	env := []string{"GOFLAGS=-mod=readonly -buildvcs=false", "GOTOOLCHAIN=local", "GOWORK=off"}
	if err := publishEntry(dir, filepath.Join(cache, "go", d.Name+"-*"), func(tmp string) error {
		return runStep(ctx, goBuildTimeout, d.goDir, env, "Go module proxy", goTool,
			"build", "-trimpath", "-o", filepath.Join(tmp, "driver"), ".")
	}); err != nil {
		return nil, err
	}
	return []string{bin}, nil
}

// ---------------------------------------------------------------------------------------------
// Rust: cargo build --locked of rust/ (pulsar-rs, pinned by Cargo.lock), from crates.io.

func (d *Driver) prepareRust(ctx context.Context, src, cache string) ([]string, error) {
	cargo, err := need("cargo", "builds the pulsar-rs driver")
	if err != nil {
		return nil, err
	}
	if _, err := need("protoc", "pulsar-rs compiles Pulsar's protocol definitions at build time (Debian: protobuf-compiler)"); err != nil {
		return nil, err
	}
	vctx, cancel := context.WithTimeout(ctx, toolProbeTimeout)
	defer cancel()
	cv, err := exec.CommandContext(vctx, cargo, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("cargo --version: %w", err)
	}
	dir := filepath.Join(src, "rust")
	hash, err := hashFiles([]string{filepath.Join(dir, "Cargo.toml"), filepath.Join(dir, "Cargo.lock"),
		filepath.Join(dir, "src", "main.rs")}, strings.TrimSpace(string(cv)), d.Name)
	if err != nil {
		return nil, err
	}
	out := filepath.Join(cache, "rust", d.Name+"-"+hash)
	bin := filepath.Join(out, "driver")
	if exists(bin) {
		return []string{bin}, nil
	}
	// The target directory is kept across source changes: a changed driver recompiles only
	// itself, not pulsar-rs and its dependencies.
	target := filepath.Join(cache, "rust", "target")
	if err := runStep(ctx, cargoTimeout, dir, nil, "crates.io", cargo,
		"build", "--release", "--locked", "--target-dir", target); err != nil {
		return nil, err
	}
	if err := publishEntry(out, filepath.Join(cache, "rust", d.Name+"-*"), func(tmp string) error {
		return copyFile(filepath.Join(target, "release", "pulsar-driver-rust"), filepath.Join(tmp, "driver"), 0o755)
	}); err != nil {
		return nil, err
	}
	return []string{bin}, nil
}

// ---------------------------------------------------------------------------------------------
// Java: jars from Maven Central via a generated POM, then javac per version.

const pomTemplate = `<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by e2e/drivers (prepare.go): the jars of one pinned Pulsar Java client. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.rebatchproxy.drivers</groupId>
  <artifactId>pulsar-client-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.pulsar</groupId>
      <artifactId>pulsar-client</artifactId>
      <version>%s</version>
    </dependency>
  </dependencies>
</project>
`

func javaBin(tool string) (string, error) {
	if jh := os.Getenv("JAVA_HOME"); jh != "" {
		p := filepath.Join(jh, "bin", tool)
		if exists(p) {
			return p, nil
		}
	}
	return need(tool, "runs the Java drivers (JDK 17)")
}

func (d *Driver) prepareJava(ctx context.Context, src, cache string) ([]string, error) {
	java, err := javaBin("java")
	if err != nil {
		return nil, err
	}
	javac, err := javaBin("javac")
	if err != nil {
		return nil, err
	}
	base := filepath.Join(cache, "java", d.Version)
	lib := filepath.Join(base, "lib")
	marker := filepath.Join(base, "lib.ok")
	if !exists(marker) {
		mvn, err := need("mvn", "downloads the Java client jars from Maven Central")
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(base, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(base, "pom.xml"), []byte(fmt.Sprintf(pomTemplate, d.Version)), 0o644); err != nil {
			return nil, err
		}
		_ = os.RemoveAll(lib)
		var names []string
		if err := publishEntry(lib, "", func(tmp string) error {
			if err := runStep(ctx, mavenTimeout, base, nil, "Maven Central", mvn, "-B", "-q", "-f", "pom.xml",
				"dependency:copy-dependencies", "-DoutputDirectory="+tmp, "-DincludeScope=runtime"); err != nil {
				return err
			}
			jars, _ := filepath.Glob(filepath.Join(tmp, "*.jar"))
			if !exists(filepath.Join(tmp, "pulsar-client-"+d.Version+".jar")) {
				return fmt.Errorf("maven copied %d jars but not pulsar-client-%s.jar", len(jars), d.Version)
			}
			for _, j := range jars {
				names = append(names, filepath.Base(j))
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if err := os.WriteFile(marker, []byte(strings.Join(names, "\n")+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	source := filepath.Join(src, "java", "PulsarDriver.java")
	// The JDK's identity (its resolved javac path and that file's size and time) is part of the
	// key; it avoids starting a JVM just to ask javac for its version.
	jv, err := toolIdentity(javac)
	if err != nil {
		return nil, err
	}
	hash, err := hashFiles([]string{source, marker}, jv, d.Version)
	if err != nil {
		return nil, err
	}
	classes := filepath.Join(base, "classes-"+hash)
	cp := classes + string(os.PathListSeparator) + filepath.Join(lib, "*")
	argv := []string{java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k", "-Xmx384m",
		"-cp", cp, "rebatchproxy.drivers.PulsarDriver"}
	if exists(classes) {
		return argv, nil
	}
	if err := publishEntry(classes, filepath.Join(base, "classes-*"), func(tmp string) error {
		return runStep(ctx, javacTimeout, base, nil, "", javac, "-nowarn", "-encoding", "UTF-8",
			"-d", tmp, "-cp", filepath.Join(lib, "*"), source)
	}); err != nil {
		return nil, err
	}
	return argv, nil
}

// ---------------------------------------------------------------------------------------------
// Python: one venv per version; the driver script runs from the source tree.

func (d *Driver) preparePython(ctx context.Context, src, cache string) ([]string, error) {
	py, err := need("python3", "creates the Python client venvs")
	if err != nil {
		return nil, err
	}
	base := filepath.Join(cache, "python", d.Version)
	venv := filepath.Join(base, "venv")
	marker := filepath.Join(base, "venv.ok")
	want := strings.Join(d.pythonReqs, " ") + "\n"
	vpy := filepath.Join(venv, "bin", "python")
	argv := []string{vpy, "-u", filepath.Join(src, "python", "driver.py")}
	if b, err := os.ReadFile(marker); err == nil && string(b) == want && exists(vpy) {
		return argv, nil
	}
	_ = os.Remove(marker)
	_ = os.RemoveAll(venv)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, err
	}
	if err := runStep(ctx, pipTimeout, base, nil, "", py, "-m", "venv", venv); err != nil {
		return nil, err
	}
	args := append([]string{"-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q",
		"--only-binary=:all:"}, d.pythonReqs...)
	if err := runStep(ctx, pipTimeout, base, nil, "PyPI", vpy, args...); err != nil {
		return nil, err
	}
	if err := os.WriteFile(marker, []byte(want), 0o644); err != nil {
		return nil, err
	}
	return argv, nil
}
