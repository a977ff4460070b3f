package docker_test

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Local base images: built here from what the registries serve (Debian's packages, the Go
// toolchain on this machine, Pulsar's distribution on Maven Central), once per machine. Each
// carries the label recipeLabel, a hash of everything it is made from; an image whose label
// matches is reused, anything else is built. REBATCH_DOCKER_REBUILD=1 rebuilds them all.
const (
	recipeLabel  = "org.rebatchproxy.recipe"
	debianTag    = "rebatchproxy.local/debian:bookworm-minbase"
	golangTag    = "rebatchproxy.local/golang:bookworm" // + "-" + Go version
	staticTag    = "rebatchproxy.local/static-debian12:nonroot"
	debianMirror = "http://deb.debian.org/debian"
)

// builtImage is one image the test made or found.
type builtImage struct {
	Tag, ID string
	Built   bool // built by this run (false: reused)
	Took    time.Duration
	Note    string
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// inspect returns an image's id and recipe label ("" if there is no such image).
func (e *engine) inspect(tag string) (id, recipe string) {
	out, err := e.dockerCmd(time.Minute, "image", "inspect", "--format",
		"{{.Id}} {{index .Config.Labels \""+recipeLabel+"\"}}", tag)
	if err != nil {
		return "", ""
	}
	id, recipe, _ = strings.Cut(strings.TrimSpace(out), " ")
	return id, recipe
}

// ensure reuses tag if its recipe label is key, or calls build (which must label it key).
func (e *engine) ensure(t *testing.T, tag, key string, build func() error) builtImage {
	t.Helper()
	if id, recipe := e.inspect(tag); id != "" && recipe == key && os.Getenv("REBATCH_DOCKER_REBUILD") != "1" {
		t.Logf("image %s: reused %s (recipe %s)", tag, short(id), key)
		return builtImage{Tag: tag, ID: id}
	}
	t0 := time.Now()
	if err := build(); err != nil {
		t.Fatalf("building %s: %v", tag, err)
	}
	id, recipe := e.inspect(tag)
	if id == "" || recipe != key {
		t.Fatalf("building %s left no image with recipe %s (found %q %q)", tag, key, id, recipe)
	}
	took := time.Since(t0)
	t.Logf("image %s: built %s in %v (recipe %s)", tag, short(id), took.Round(time.Second), key)
	return builtImage{Tag: tag, ID: id, Built: true, Took: took}
}

func short(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// ensureDebian: a debootstrap --variant=minbase bookworm root filesystem, kept as a tarball in
// the cache directory and imported as debianTag.
func (e *engine) ensureDebian(t *testing.T) builtImage {
	mirror := os.Getenv("REBATCH_DEBIAN_MIRROR")
	if mirror == "" {
		mirror = debianMirror
	}
	key := hashOf("debootstrap --variant=minbase bookworm", mirror, runtime.GOARCH)
	tarball := filepath.Join(e.cache, "debian-bookworm-minbase-"+key+".tar")
	return e.ensure(t, debianTag, key, func() error {
		if _, err := os.Stat(tarball); err != nil || os.Getenv("REBATCH_DOCKER_REBUILD") == "1" {
			if err := debootstrap(t, mirror, tarball); err != nil {
				return err
			}
		} else {
			t.Logf("image %s: importing the cached root filesystem %s", debianTag, tarball)
		}
		out, err := e.dockerCmd(10*time.Minute, "import",
			"--change", "LABEL "+recipeLabel+"="+key,
			"--change", `LABEL org.rebatchproxy.source="debootstrap --variant=minbase bookworm `+mirror+`"`,
			"--change", `CMD ["bash"]`, tarball, debianTag)
		if err != nil {
			return fmt.Errorf("%v\n%s", err, tail(out, 20))
		}
		return nil
	})
}

// debootstrap makes the root filesystem tarball (without apt's caches, device nodes, /proc, /sys).
func debootstrap(t *testing.T, mirror, tarball string) error {
	root := tarball + ".rootfs"
	_ = os.RemoveAll(root)
	defer os.RemoveAll(root)
	t0 := time.Now()
	if out, err := run(20*time.Minute, nil, "", lookPath("debootstrap"), "--variant=minbase", "bookworm", root, mirror); err != nil {
		return fmt.Errorf("%v\n%s", err, tail(out, 30))
	}
	for _, g := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "var/log/*.log", "dev/*", "proc/*", "sys/*", "run/*"} {
		matches, _ := filepath.Glob(filepath.Join(root, g))
		for _, m := range matches {
			if fi, err := os.Lstat(m); err == nil && fi.Name() != "partial" && fi.Name() != "lock" {
				_ = os.RemoveAll(m)
			}
		}
	}
	tmp := tarball + ".tmp"
	if out, err := run(10*time.Minute, nil, "", "tar", "--numeric-owner", "-C", root, "-cf", tmp, "."); err != nil {
		return fmt.Errorf("%v\n%s", err, tail(out, 20))
	}
	t.Logf("image %s: debootstrap (%s) in %v", debianTag, mirror, time.Since(t0).Round(time.Second))
	return os.Rename(tmp, tarball)
}

// ctxEntry is one file tree of a build context sent on stdin: src on disk becomes name.
type ctxEntry struct {
	name, src string
	mode      int64                 // if non-zero, the mode of a single file
	skip      func(rel string) bool // relative to src, slash-separated
}

// writeContext writes a build context as a tar stream.
func writeContext(w io.Writer, entries []ctxEntry) error {
	tw := tar.NewWriter(w)
	for _, en := range entries {
		err := filepath.WalkDir(en.src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(en.src, p)
			rel = filepath.ToSlash(rel)
			if rel != "." && en.skip != nil && en.skip(rel) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			h.Name = en.name
			if rel != "." {
				h.Name = en.name + "/" + rel
			}
			h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
			if en.mode != 0 && fi.Mode().IsRegular() {
				h.Mode = en.mode
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				_, err = io.Copy(tw, f)
				f.Close()
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

// buildFromStdin runs docker build with the context streamed on stdin (host network: apt and
// the Go module proxy are reached during builds only; running containers never use it).
func (e *engine) buildFromStdin(tag, key string, buildArgs []string, entries []ctxEntry) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	args := []string{"build", "--network", "host", "--label", recipeLabel + "=" + key, "-t", tag}
	for _, a := range buildArgs {
		args = append(args, "--build-arg", a)
	}
	args = append(args, "-")
	cmd := exec.CommandContext(ctx, e.docker, args...)
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=0")
	pr, pw := io.Pipe()
	cmd.Stdin = pr
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	werr := make(chan error, 1)
	go func() {
		err := writeContext(pw, entries)
		pw.CloseWithError(err)
		werr <- err
	}()
	err := cmd.Wait()
	pr.Close()
	if e := <-werr; e != nil && err == nil {
		err = e
	}
	if err != nil {
		return out.String(), fmt.Errorf("docker %s: %v\n%s", strings.Join(args, " "), err, tail(out.String(), 30))
	}
	return out.String(), nil
}

// ensureGolang: the builder stand-in for golang:1.26-bookworm, with this machine's GOROOT.
func (e *engine) ensureGolang(t *testing.T, debian builtImage) builtImage {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	goroot := strings.TrimSpace(string(out))
	gover, err := exec.Command(filepath.Join(goroot, "bin", "go"), "version").Output()
	if err != nil {
		t.Fatalf("go version in %s: %v", goroot, err)
	}
	ver := strings.Fields(string(gover))[2] // "go version go1.26.8 linux/amd64"
	tag := golangTag + "-" + strings.TrimPrefix(ver, "go")
	dockerfile := filepath.Join(imagesDir(t), "golang", "Dockerfile")
	localCA := "/usr/local/share/ca-certificates"
	if st, err := os.Stat(localCA); err != nil || !st.IsDir() {
		localCA = t.TempDir() // none: an empty directory
	}
	var cas []string
	_ = filepath.WalkDir(localCA, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			cas = append(cas, p, string(b))
		}
		return nil
	})
	key := hashOf(append([]string{readFile(t, dockerfile), debian.ID, string(gover), goroot}, cas...)...)
	return e.ensure(t, tag, key, func() error {
		_, err := e.buildFromStdin(tag, key, []string{"BASE=" + debian.ID}, []ctxEntry{
			{name: "Dockerfile", src: dockerfile},
			{name: "local-ca", src: localCA},
			{name: "go", src: goroot, skip: func(rel string) bool {
				return rel == "test" || rel == ".git" || rel == "pkg/obj"
			}},
		})
		return err
	})
}

// ensureStatic: the runtime stand-in for gcr.io/distroless/static-debian12:nonroot.
func (e *engine) ensureStatic(t *testing.T, debian builtImage) builtImage {
	dockerfile := filepath.Join(imagesDir(t), "static", "Dockerfile")
	key := hashOf(readFile(t, dockerfile), debian.ID)
	return e.ensure(t, staticTag, key, func() error {
		_, err := e.buildFromStdin(staticTag, key, []string{"BASE=" + debian.ID}, []ctxEntry{
			{name: "Dockerfile", src: dockerfile},
		})
		return err
	})
}

// ensurePulsar: apachepulsar/pulsar:<version> built from the distribution e2e/pulsar/pulsar.sh
// unpacked (home), tagged with the name the compose file uses.
func (e *engine) ensurePulsar(t *testing.T, debian builtImage, tag, home string) builtImage {
	dir := filepath.Join(imagesDir(t), "pulsar")
	dockerfile := filepath.Join(dir, "Dockerfile")
	script := filepath.Join(dir, "apply-config-from-env.py")
	key := hashOf(readFile(t, dockerfile), readFile(t, script), debian.ID, filepath.Base(home))
	return e.ensure(t, tag, key, func() error {
		_, err := e.buildFromStdin(tag, key, []string{"BASE=" + debian.ID}, []ctxEntry{
			{name: "Dockerfile", src: dockerfile},
			{name: "apply-config-from-env.py", src: script, mode: 0o755},
			{name: "pulsar", src: home, skip: func(rel string) bool {
				// What a local run of the distribution leaves behind, not part of it.
				return rel == "logs" || rel == "data" || rel == ".unpacked" || strings.HasPrefix(rel, "logs/")
			}},
		})
		return err
	})
}

func imagesDir(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "images")
}

// runState is what the previous run built, kept in the cache directory (state.json).
type runState struct {
	ProxyContext string `json:"proxy_context"` // hash of the proxy's build context and base images
	ProxyID      string `json:"proxy_id"`
	BuilderStage string `json:"builder_stage"` // last image of the proxy Dockerfile's build stage
}

func loadState(t *testing.T, dir string) runState {
	var s runState
	if b, err := os.ReadFile(filepath.Join(dir, "state.json")); err == nil {
		_ = json.Unmarshal(b, &s)
	}
	return s
}

func saveState(t *testing.T, dir string, s runState) {
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "state.json"), b, 0o644); err != nil {
		t.Errorf("saving state: %v", err)
	}
}
