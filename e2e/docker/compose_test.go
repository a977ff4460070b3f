// Package docker_test runs the project's docker-compose.yml for real: it installs and starts a
// Docker engine if needed, builds every image the file names locally (no registry is reachable),
// runs `docker-compose up` on the unchanged file, drives pulsar-client-go through the proxy
// container, checks what the broker stored, stops the proxy with SIGTERM and tears everything
// down. See README.md.
package docker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
	"gopkg.in/yaml.v3"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// project is the compose project name: its containers, network and volumes carry it.
const project = "rebatchproxy-e2e"

const messages = 1000

// composeFile is what the test reads from docker-compose.yml.
type composeFile struct {
	Services map[string]struct {
		Image           string `yaml:"image"`
		StopGracePeriod string `yaml:"stop_grace_period"`
	} `yaml:"services"`
}

// Given a machine with no registry access (Docker installed and started by the test if needed),
// when the images docker-compose.yml names are built locally and `docker-compose up` runs the
// unchanged file,
// then the broker container turns healthy, the proxy container reports ready, 1,000 unbatched
// messages produced and consumed through the proxy container come back in order and intact and
// the broker stored them in at least five times fewer entries (the file's coalesce policy), a
// SIGTERM drains the proxy and it exits 0 within the file's stop_grace_period with its log lines,
// and `down` leaves no container, network or volume of the project. A second run builds nothing.
func TestComposeUpRunsProxyInFrontOfPulsar(t *testing.T) {
	start := time.Now()
	repo := harness.RepoRoot()
	var cf composeFile
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(repo, "docker-compose.yml"))), &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	pulsarTag, proxyTag := cf.Services["pulsar"].Image, cf.Services["proxy"].Image
	grace, err := time.ParseDuration(cf.Services["proxy"].StopGracePeriod)
	if pulsarTag == "" || proxyTag == "" || err != nil {
		t.Fatalf("docker-compose.yml: want services pulsar and proxy with images and the proxy's stop_grace_period (got %q, %q, %v)", pulsarTag, proxyTag, err)
	}

	// Engine.
	e := ensureEngine(t)
	tEngine := time.Since(start)

	// Images: base images once per machine, then the proxy from the project's Dockerfile.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// e2e/pulsar/pulsar.sh's download (Maven's cache) and unpacked copy, fetched if missing.
	if out, err := run(20*time.Minute, nil, repo, filepath.Join(repo, "e2e", "pulsar", "pulsar.sh"), "fetch"); err != nil {
		t.Fatalf("Pulsar distribution: %v\n%s", err, tail(out, 20))
	}
	home, err := harness.PulsarHome(ctx)
	if err != nil {
		t.Fatalf("Pulsar distribution: %v", err)
	}
	if want := "apache-pulsar-" + strings.TrimPrefix(pulsarTag[strings.LastIndex(pulsarTag, ":")+1:], "v"); filepath.Base(home) != want {
		t.Fatalf("docker-compose.yml names %s but e2e/pulsar/pulsar.sh gives %s", pulsarTag, home)
	}
	debian := e.ensureDebian(t)
	golang := e.ensureGolang(t, debian)
	static := e.ensureStatic(t, debian)
	pulsarImg := e.ensurePulsar(t, debian, pulsarTag, home)
	proxyImg := e.buildProxy(t, repo, proxyTag, golang, static)
	tImages := time.Since(start) - tEngine
	images := []builtImage{debian, golang, static, pulsarImg, proxyImg}
	e.logImages(t, images)

	// Compose up on free loopback ports.
	ports := map[string]int{}
	for _, name := range []string{"REBATCH_PROXY_PORT", "REBATCH_METRICS_PORT", "REBATCH_BROKER_PORT", "REBATCH_ADMIN_PORT"} {
		ports[name] = freePort(t)
	}
	env := composeEnv(ports)
	c := &composeRun{e: e, repo: repo, env: env}
	_, _ = c.run(2*time.Minute, "down", "-v", "--remove-orphans") // a previous run's leftovers
	t.Cleanup(func() { c.down(t) })
	t0 := time.Now()
	if out, err := c.run(6*time.Minute, "up", "-d"); err != nil {
		c.dumpLogs(t)
		t.Fatalf("compose up: %v\n%s", err, tail(out, 30))
	}
	pulsarID, proxyID := c.containerID(t, "pulsar"), c.containerID(t, "proxy")
	if h := e.state(t, pulsarID, "{{.State.Health.Status}}"); h != "healthy" {
		c.dumpLogs(t)
		t.Fatalf("pulsar container health: %q after compose up, want healthy", h)
	}
	if u := e.state(t, proxyID, "{{.Config.User}}"); u != "nonroot:nonroot" {
		t.Errorf("proxy container runs as %q, want nonroot:nonroot (the Dockerfile's USER)", u)
	}
	metrics := fmt.Sprintf("http://127.0.0.1:%d", ports["REBATCH_METRICS_PORT"])
	waitReady(t, metrics+"/readyz", time.Minute, c)
	tUp := time.Since(t0)
	t.Logf("compose: up in %v: pulsar healthy, proxy ready at %s/readyz", tUp.Round(time.Second), metrics)

	// Traffic through the proxy container.
	t1 := time.Now()
	proxyURL := fmt.Sprintf("pulsar://127.0.0.1:%d", ports["REBATCH_PROXY_PORT"])
	broker := harness.Attach(fmt.Sprintf("pulsar://127.0.0.1:%d", ports["REBATCH_BROKER_PORT"]),
		fmt.Sprintf("http://127.0.0.1:%d", ports["REBATCH_ADMIN_PORT"]), "")
	roundTrip(t, proxyURL, broker)
	tTraffic := time.Since(t1)

	// SIGTERM drains the proxy within the grace period.
	t2 := time.Now()
	drain(t, c, proxyURL, proxyID, grace)
	tDrain := time.Since(t2)

	t3 := time.Now()
	c.down(t)
	t.Logf("timings: engine %v, images %v, compose up %v, 1,000 messages %v, drain %v, down %v; total %v",
		tEngine.Round(time.Second), tImages.Round(time.Second), tUp.Round(time.Second), tTraffic.Round(time.Second),
		tDrain.Round(time.Second), time.Since(t3).Round(time.Second), time.Since(start).Round(time.Second))
}

func freePort(t *testing.T) int {
	p, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// composeEnv is the test's environment with the compose file's variables set to ours (and no
// REBATCH_* inherited from outside).
func composeEnv(ports map[string]int) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REBATCH_") && !strings.HasPrefix(kv, "COMPOSE_") && !strings.HasPrefix(kv, "DOCKER_BUILDKIT=") {
			env = append(env, kv)
		}
	}
	env = append(env, "REBATCH_BIND_ADDRESS=127.0.0.1", "DOCKER_BUILDKIT=0")
	for k, v := range ports {
		env = append(env, k+"="+strconv.Itoa(v))
	}
	return env
}

// buildProxy builds the project's Dockerfile with the local base images and tags it as the
// compose file names it. The Docker build cache does the reuse; the run state records which
// context gave which image so that an unchanged context must give the same image.
func (e *engine) buildProxy(t *testing.T, repo, tag string, golang, static builtImage) builtImage {
	// The context and both base images: a rebuilt base rightly gives a new proxy image.
	sum := hashOf(proxyContextHash(t, repo), golang.ID, static.ID)
	prev := loadState(t, e.cache)
	// The previous run's image (and so its build cache, the parents of that image) still there?
	prevThere := false
	if prev.ProxyID != "" {
		_, err := e.dockerCmd(time.Minute, "image", "inspect", prev.ProxyID)
		prevThere = err == nil
	}
	t0 := time.Now()
	out, err := e.dockerCmd(20*time.Minute, "build", "--network", "host",
		"--build-arg", "BUILD_IMAGE="+golang.Tag, "--build-arg", "RUNTIME_IMAGE="+static.Tag,
		"--label", recipeLabel+"="+sum, "-t", tag, repo)
	if err != nil {
		t.Fatalf("building the proxy image from %s/Dockerfile: %v\n%s", repo, err, tail(out, 30))
	}
	steps, cached := buildSteps(out)
	id, _ := e.inspect(tag)
	img := builtImage{Tag: tag, ID: id, Built: cached < steps, Took: time.Since(t0),
		Note: fmt.Sprintf("%d of %d build steps from cache", cached, steps)}
	t.Logf("image %s: %s %s in %v (%s)", tag, map[bool]string{true: "built", false: "all cached:"}[img.Built],
		short(id), img.Took.Round(time.Second), img.Note)
	if prev.ProxyContext == sum && prevThere {
		if cached < steps {
			t.Errorf("proxy image: unchanged context and bases since the previous run, but %d of %d build steps ran again", steps-cached, steps)
		}
		if prev.ProxyID != id {
			t.Errorf("proxy image: the build context is the one of the previous run (%s) but the image changed: %s, was %s", sum, short(id), short(prev.ProxyID))
		} else {
			t.Logf("image %s: unchanged since the previous run (same context %s, same id)", tag, sum)
		}
	}
	stage := builderStage(out)
	// What the previous run built and this one superseded (an image the proxy Dockerfile's
	// builder stage left, with its compile and module layers; an untagged proxy image) is
	// removed, so that the image store does not grow by a build per source change. Only ids
	// this test recorded are touched.
	for _, old := range []string{prev.BuilderStage, prev.ProxyID} {
		if old != "" && old != stage && old != id {
			if out, err := e.dockerCmd(2*time.Minute, "rmi", old); err != nil {
				t.Logf("image %s: not removing the superseded %s: %s", tag, short(old), strings.TrimSpace(tail(out, 1)))
			} else {
				t.Logf("image %s: removed the superseded %s", tag, short(old))
			}
		}
	}
	saveState(t, e.cache, runState{ProxyContext: sum, ProxyID: id, BuilderStage: stage})
	return img
}

// builderStage returns the id of the last image of the build's first stage (the one before the
// second FROM) in a legacy-builder log, or "".
func builderStage(out string) string {
	blocks := strings.Split(out, "\nStep ")
	froms := 0
	for i, block := range blocks {
		if _, instr, _ := strings.Cut(block, " : "); !strings.HasPrefix(instr, "FROM ") {
			continue
		}
		if froms++; froms == 2 && i > 0 {
			prev := blocks[i-1]
			if j := strings.LastIndex(prev, " ---> "); j >= 0 {
				if f := strings.Fields(prev[j+len(" ---> "):]); len(f) > 0 {
					return f[0]
				}
			}
		}
	}
	return ""
}

// buildSteps counts the steps of a legacy-builder log that make a layer (not FROM, not an ARG
// before FROM) and how many of them came from the build cache.
func buildSteps(out string) (steps, cached int) {
	for _, block := range strings.Split(out, "\nStep ")[1:] {
		_, instr, _ := strings.Cut(block, " : ")
		if strings.HasPrefix(instr, "FROM ") || !strings.Contains(block, " ---> ") {
			continue
		}
		steps++
		if strings.Contains(block, " ---> Using cache") {
			cached++
		}
	}
	return steps, cached
}

// proxyContextHash hashes what the proxy's build context holds per .dockerignore (go.mod,
// go.sum, the Dockerfile and the files of the directories listed there but tests, testdata
// and Markdown).
func proxyContextHash(t *testing.T, repo string) string {
	h := sha256.New()
	add := func(rel string) {
		b, err := os.ReadFile(filepath.Join(repo, rel))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	for _, f := range []string{"Dockerfile", ".dockerignore", "go.mod", "go.sum"} {
		add(f)
	}
	var files []string
	for _, line := range strings.Split(readFile(t, filepath.Join(repo, ".dockerignore")), "\n") {
		dir, ok := strings.CutPrefix(strings.TrimSpace(line), "!")
		if !ok || !strings.HasSuffix(dir, "/") {
			continue
		}
		_ = filepath.WalkDir(filepath.Join(repo, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if !d.IsDir() && !strings.HasSuffix(p, "_test.go") && !strings.HasSuffix(p, ".md") {
				rel, _ := filepath.Rel(repo, p)
				files = append(files, rel)
			}
			return nil
		})
	}
	sort.Strings(files)
	for _, f := range files {
		add(f)
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// logImages prints what each image is: size, layers, built or reused.
func (e *engine) logImages(t *testing.T, imgs []builtImage) {
	for _, img := range imgs {
		out, err := e.dockerCmd(time.Minute, "image", "inspect", "--format", "{{.Size}} {{len .RootFS.Layers}}", img.ID)
		if err != nil {
			t.Errorf("inspect %s: %v", img.Tag, err)
			continue
		}
		var size, layers int64
		fmt.Sscan(out, &size, &layers)
		what := "reused"
		if img.Built {
			what = fmt.Sprintf("built in %v", img.Took.Round(time.Second))
		}
		if img.Note != "" {
			what += ", " + img.Note
		}
		t.Logf("image %-48s %s %7.1f MB %2d layers (%s)", img.Tag, short(img.ID), float64(size)/1e6, layers, what)
	}
}

// composeRun runs the compose tool on the project's file with the test's environment.
type composeRun struct {
	e    *engine
	repo string
	env  []string
	once sync.Once
}

func (c *composeRun) run(timeout time.Duration, args ...string) (string, error) {
	full := append(append([]string{}, c.e.compose[1:]...), append([]string{"-p", project, "-f", filepath.Join(c.repo, "docker-compose.yml")}, args...)...)
	return run(timeout, c.env, c.repo, c.e.compose[0], full...)
}

func (c *composeRun) containerID(t *testing.T, service string) string {
	out, err := c.run(time.Minute, "ps", "-q", service)
	id := strings.TrimSpace(out)
	if err != nil || id == "" || strings.Contains(id, "\n") {
		t.Fatalf("compose ps -q %s: %q %v", service, out, err)
	}
	return id
}

func (c *composeRun) dumpLogs(t *testing.T) {
	out, _ := c.run(time.Minute, "logs", "--no-color", "--tail", "60")
	t.Logf("compose logs (last lines of each service):\n%s", out)
}

// down removes the project's containers, network and volumes (once) and checks none is left.
func (c *composeRun) down(t *testing.T) {
	c.once.Do(func() {
		if t.Failed() {
			c.dumpLogs(t)
		}
		if out, err := c.run(3*time.Minute, "down", "-v", "--remove-orphans"); err != nil {
			t.Errorf("compose down: %v\n%s", err, tail(out, 20))
		}
		filter := "label=com.docker.compose.project=" + project
		for _, what := range [][]string{{"ps", "-aq"}, {"network", "ls", "-q"}, {"volume", "ls", "-q"}} {
			out, err := c.e.dockerCmd(time.Minute, append(what, "--filter", filter)...)
			if err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("after compose down, docker %s --filter %s: %q %v", strings.Join(what, " "), filter, out, err)
			}
		}
		t.Logf("compose: down; no container, network or volume of project %s left", project)
	})
}

// state reads one field of a container's docker inspect.
func (e *engine) state(t *testing.T, id, format string) string {
	out, err := e.dockerCmd(time.Minute, "inspect", "--format", format, id)
	if err != nil {
		t.Fatalf("docker inspect %s: %v\n%s", id, err, out)
	}
	return strings.TrimSpace(out)
}

func waitReady(t *testing.T, url string, within time.Duration, c *composeRun) {
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.TrimSpace(string(b)) == "ready" {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		} else {
			last = err.Error()
		}
		time.Sleep(300 * time.Millisecond)
	}
	c.dumpLogs(t)
	t.Fatalf("proxy container not ready at %s within %v: %s", url, within, last)
}

func quietLogger() plog.Logger { return harness.ClientLogger(logrus.WarnLevel) }

func newClient(t *testing.T, url string) pulsar.Client {
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, OperationTimeout: 30 * time.Second,
		ConnectionTimeout: 10 * time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// roundTrip produces 1,000 unbatched messages through the proxy, consumes them through the
// proxy and checks what the broker stored: the compose file's coalesce policy merged them.
func roundTrip(t *testing.T, proxyURL string, broker *harness.Broker) {
	topic := fmt.Sprintf("persistent://public/default/compose-%d", time.Now().UnixNano())
	client := newClient(t, proxyURL)
	defer client.Close()
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "e2e-docker"})
	if err != nil {
		t.Fatalf("subscribe through the proxy container: %v", err)
	}
	defer consumer.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, MaxPendingMessages: 1000})
	if err != nil {
		t.Fatalf("producer through the proxy container: %v", err)
	}
	payload := func(i int) string { return fmt.Sprintf("docker-%04d", i) }
	var wg sync.WaitGroup
	var mu sync.Mutex
	var sendErrs []error
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; i < messages; i++ {
		wg.Add(1)
		producer.SendAsync(ctx, &pulsar.ProducerMessage{Payload: []byte(payload(i)), Key: "k" + strconv.Itoa(i/50%7),
			Properties: map[string]string{"i": strconv.Itoa(i)}},
			func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				if err != nil {
					mu.Lock()
					sendErrs = append(sendErrs, err)
					mu.Unlock()
				}
				wg.Done()
			})
	}
	if err := producer.FlushWithCtx(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	wg.Wait()
	producer.Close()
	if len(sendErrs) > 0 {
		t.Fatalf("%d of %d sends failed, first: %v", len(sendErrs), messages, sendErrs[0])
	}
	for i := 0; i < messages; i++ {
		m, err := consumer.Receive(ctx)
		if err != nil {
			t.Fatalf("received %d of %d through the proxy container: %v", i, messages, err)
		}
		if string(m.Payload()) != payload(i) || m.Key() != "k"+strconv.Itoa(i/50%7) || m.Properties()["i"] != strconv.Itoa(i) {
			t.Fatalf("message %d: got payload %q key %q props %v", i, m.Payload(), m.Key(), m.Properties())
		}
		if err := consumer.Ack(m); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}

	// What the broker stored (its admin API on the published port).
	entries, err := broker.StoredEntries(ctx, topic)
	if err != nil {
		t.Fatalf("stored entries: %v", err)
	}
	stored := 0
	for _, en := range entries {
		for _, m := range en.Messages {
			if string(m.Payload) != payload(stored) {
				t.Fatalf("stored message %d: %q, want %q", stored, m.Payload, payload(stored))
			}
			stored++
		}
	}
	raw, err := broker.Admin(ctx, http.MethodGet, "/admin/v2/persistent/public/default/"+topic[strings.LastIndex(topic, "/")+1:]+"/internalStats", nil)
	if err != nil {
		t.Fatalf("internal stats: %v", err)
	}
	var st struct {
		NumberOfEntries int64 `json:"numberOfEntries"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatalf("internal stats: %v", err)
	}
	t.Logf("broker stored %d messages in %d entries (internalStats numberOfEntries %d): %.1f messages per entry under coalesce",
		stored, len(entries), st.NumberOfEntries, float64(stored)/float64(max(len(entries), 1)))
	if stored != messages {
		t.Fatalf("broker stored %d messages, sent %d", stored, messages)
	}
	if st.NumberOfEntries != int64(len(entries)) {
		t.Errorf("internalStats numberOfEntries %d, but %d entries read", st.NumberOfEntries, len(entries))
	}
	if len(entries) > messages/5 {
		t.Errorf("coalesce through the proxy container: %d entries for %d unbatched sends, want at most %d", len(entries), messages, messages/5)
	}
}

// drain: with a client connected, `compose stop proxy` sends SIGTERM; the proxy keeps serving
// while the client stays (draining), exits 0 once it leaves, within the grace period, and logs it.
func drain(t *testing.T, c *composeRun, proxyURL, proxyID string, grace time.Duration) {
	client := newClient(t, proxyURL)
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{Topic: fmt.Sprintf("persistent://public/default/drain-%d", time.Now().UnixNano()),
		SubscriptionName: "e2e-docker"})
	if err != nil {
		client.Close()
		t.Fatalf("subscribe before SIGTERM: %v", err)
	}
	// compose passes the file's stop_grace_period on as the container's stop timeout.
	if st := c.e.state(t, proxyID, "{{.Config.StopTimeout}}"); st != strconv.Itoa(int(grace.Seconds())) {
		t.Errorf("proxy container StopTimeout %q, want the compose file's stop_grace_period %v", st, grace)
	}
	t0 := time.Now()
	type result struct {
		out string
		err error
	}
	stopped := make(chan result, 1)
	go func() {
		out, err := c.run(2*grace, "stop", "proxy") // no -t: the file's stop_grace_period applies
		stopped <- result{out, err}
	}()
	logs := func() string {
		out, _ := c.e.dockerCmd(time.Minute, "logs", proxyID)
		return out
	}
	// Draining: still running with the client connected, and it said so.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs(), "signal received; draining") {
		if time.Now().After(deadline) {
			t.Fatalf("no drain log line within 10 s of compose stop:\n%s", tail(logs(), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if running := c.e.state(t, proxyID, "{{.State.Running}}"); running != "true" {
		t.Errorf("proxy container stopped while a client was still connected and --drain-timeout had not passed (running=%s)", running)
	}
	consumer.Close()
	client.Close()
	t.Logf("drain: client closed %v after compose stop", time.Since(t0).Round(time.Millisecond))
	var r result
	select {
	case r = <-stopped:
	case <-time.After(2*grace + 10*time.Second):
		t.Fatalf("compose stop proxy did not return within %v", 2*grace)
	}
	took := time.Since(t0)
	if r.err != nil {
		t.Fatalf("compose stop proxy: %v\n%s", r.err, r.out)
	}
	code := c.e.state(t, proxyID, "{{.State.ExitCode}} {{.State.OOMKilled}}")
	l := logs()
	t.Logf("drain: proxy exited (%s) %v after SIGTERM (stop_grace_period %v); its last lines:\n%s", code, took.Round(time.Millisecond), grace, tail(l, 4))
	if code != "0 false" {
		t.Errorf("proxy container exit code/OOM %q after SIGTERM, want \"0 false\" (137 means Docker had to SIGKILL it)", code)
	}
	if took >= grace {
		t.Errorf("proxy took %v to stop, not within stop_grace_period %v", took, grace)
	}
	for _, want := range []string{"signal received; draining", "signal=terminated", "msg=stopped"} {
		if !strings.Contains(l, want) {
			t.Errorf("proxy log lacks %q:\n%s", want, tail(l, 20))
		}
	}
	if strings.Contains(l, "drain deadline reached") {
		t.Errorf("proxy hit its drain deadline although the client left:\n%s", tail(l, 10))
	}
}
