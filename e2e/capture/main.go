// Command capture records real Pulsar traffic as golden files for package
// wire's tests.
//
// It starts a recording TCP relay in front of a real broker (see Relay),
// points a real client at it, runs the capture scenarios (scenarios.go) and
// writes, per client and scenario:
//
//	<out>/<client>-<version>/<scenario>/conn<N>.c2b.bin  client->broker bytes
//	<out>/<client>-<version>/<scenario>/conn<N>.b2c.bin  broker->client bytes
//	<out>/<client>-<version>/<scenario>/manifest.json    what, how, frame counts
//
// Each .bin file is the exact byte stream of one direction of one TCP
// connection, as sent by the client or the broker, so every frame can be
// read back with wire.ReadFrame.
//
// Usage, from the repository root, with a broker on the default ports:
//
//	go run ./e2e/capture -client go                # pulsar-client-go linked here
//	go run ./e2e/capture -client python            # PyPI pulsar-client in a venv under wire/.cache
//	go run ./e2e/capture -driver go-v0.8.1             # any pinned client of e2e/drivers
//	go run ./e2e/capture -driver java-4.0.13
//	go run ./e2e/capture -client mine -client-version 1.0 \
//	    -exec 'my-driver --url {url} --topic {topic}'            # any driver taking Scenario.Args
//
// -scenario selects a comma-separated subset (default all).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/wire"
)

type options struct {
	broker, admin, out string
	client, version    string
	execCmd, python    string
	pythonClient, scen string
	tag                string
	driver             string
	timeout            time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.broker, "broker", "127.0.0.1:16650", "broker host:port")
	flag.StringVar(&o.admin, "admin", "http://127.0.0.1:18080", "broker admin URL (for its version)")
	flag.StringVar(&o.out, "out", "wire/testdata/golden", "output directory")
	flag.StringVar(&o.client, "client", "go", "go | python | a label for -exec")
	flag.StringVar(&o.version, "client-version", "", "client version (required with -exec)")
	flag.StringVar(&o.execCmd, "exec", "", "external driver command; {url} and {topic} are substituted, scenario flags appended")
	flag.StringVar(&o.python, "python", "wire/.cache/pyvenv/bin/python", "python of the venv used for -client python (created if missing)")
	flag.StringVar(&o.pythonClient, "python-client", "3.13.0", "PyPI pulsar-client version installed into a new venv")
	flag.StringVar(&o.scen, "scenario", "all", "comma-separated scenario names, or all")
	flag.DurationVar(&o.timeout, "timeout", 90*time.Second, "per-scenario timeout")
	flag.StringVar(&o.driver, "driver", "", "name of an e2e/drivers client, e.g. go-v0.8.1, java-4.0.13, python-3.1.0")
	flag.StringVar(&o.tag, "tag", "", "suffix for the client directory, for captures against a differently configured broker (e.g. bem)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "capture:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	list := findScenarios(o.scen)
	if len(list) == 0 {
		return fmt.Errorf("no scenario matches %q", o.scen)
	}
	brokerVersion, err := httpGet(o.admin + "/admin/v2/brokers/version")
	if err != nil {
		return fmt.Errorf("broker not reachable: %w", err)
	}
	bem, err := exposesBrokerEntryMetadata(o.admin)
	if err != nil {
		return err
	}
	var drive func(ctx context.Context, url, topic string, s Scenario) error
	label := o.client
	switch {
	case o.driver != "":
		d, err := drivers.ByName(o.driver)
		if err != nil {
			return err
		}
		if err := d.Prepare(context.Background()); err != nil {
			return fmt.Errorf("prepare %s: %w", d.Name, err)
		}
		label, o.client, o.version = d.Client, d.Client, d.Version
		drive = func(ctx context.Context, url, topic string, s Scenario) error {
			return runE2EDriver(ctx, d, url, topic, s)
		}
	case o.execCmd != "":
		if o.version == "" {
			return errors.New("-exec needs -client-version")
		}
		drive = func(ctx context.Context, url, topic string, s Scenario) error {
			return runExternal(ctx, o.execCmd, url, topic, s)
		}
	case o.client == "go":
		o.version = goClientVersion()
		drive = runGo
	case o.client == "python":
		if o.version, err = setupPython(o.python, o.pythonClient); err != nil {
			return err
		}
		script, _ := filepath.Abs("e2e/capture/python/capture_driver.py")
		drive = func(ctx context.Context, url, topic string, s Scenario) error {
			return runExternal(ctx, o.python+" "+script+" --url {url} --topic {topic}", url, topic, s)
		}
	default:
		return fmt.Errorf("unknown -client %q without -exec", o.client)
	}
	dirName := label + "-" + o.version
	if o.tag != "" {
		dirName += "+" + o.tag
	}
	// A client failing one scenario (old releases have bugs) must not cost
	// the captures of the others: report the failures at the end.
	var failed []string
	for _, s := range list {
		err := captureOne(o, dirName, brokerVersion, bem, s, drive)
		switch {
		case errors.Is(err, errUnsupported):
			fmt.Printf("%s/%s: not supported by this client, skipped\n", dirName, s.Name)
		case err != nil:
			fmt.Fprintf(os.Stderr, "%s/%s: FAILED: %v\n", dirName, s.Name, err)
			failed = append(failed, s.Name)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s: %d scenario(s) failed, nothing written for them: %s", dirName, len(failed), strings.Join(failed, ", "))
	}
	return nil
}

var errUnsupported = errors.New("scenario not supported by the client")

// manifest is written beside the captured streams; package wire's golden
// tests read it to know what each capture must contain.
type manifest struct {
	Client        string `json:"client"`
	ClientVersion string `json:"client_version"`
	BrokerVersion string `json:"broker_version"`
	// BrokerEntryMetadata is true when the broker was configured to put
	// the 0x0e02 block in MESSAGE frames (clients ask for it by default).
	BrokerEntryMetadata bool         `json:"broker_entry_metadata"`
	Topic               string       `json:"topic"`
	CapturedAt          string       `json:"captured_at"`
	Scenario            Scenario     `json:"scenario"`
	Connections         []connReport `json:"connections"`
}

type connReport struct {
	C2B       string         `json:"c2b"`
	B2C       string         `json:"b2c"`
	C2BFrames map[string]int `json:"c2b_frames"`
	B2CFrames map[string]int `json:"b2c_frames"`
	// RewrittenForClient lists broker frames the relay changed on their
	// way to the client; the .b2c.bin file holds the broker's originals.
	RewrittenForClient []string `json:"rewritten_for_client,omitempty"`
}

func captureOne(o options, dirName, brokerVersion string, bem bool, s Scenario, drive func(context.Context, string, string, Scenario) error) error {
	relay := &Relay{Broker: o.broker, MaxMessageSize: s.RelayMaxMessageSize}
	if err := relay.Start(); err != nil {
		return err
	}
	topic := fmt.Sprintf("persistent://public/default/golden-%s-%s-%d", strings.ReplaceAll(dirName, ".", "_"), s.Name, time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	err := drive(ctx, relay.URL(), topic, s)
	cancel()
	relay.Close()
	if err != nil {
		return err
	}
	dir := filepath.Join(o.out, dirName, s.Name)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	m := manifest{
		Client: o.client, ClientVersion: o.version, BrokerVersion: brokerVersion, BrokerEntryMetadata: bem, Topic: topic,
		CapturedAt: time.Now().UTC().Format(time.RFC3339), Scenario: s,
	}
	for i, rec := range relay.Recordings() {
		if len(rec.Errors) > 0 {
			return fmt.Errorf("connection %d: %v", i, rec.Errors)
		}
		if len(rec.C2B) == 0 && len(rec.B2C) == 0 {
			continue
		}
		cr := connReport{C2B: fmt.Sprintf("conn%d.c2b.bin", i), B2C: fmt.Sprintf("conn%d.b2c.bin", i), RewrittenForClient: rec.Rewritten}
		var err error
		if cr.C2BFrames, err = countFrames(rec.C2B); err != nil {
			return fmt.Errorf("connection %d client stream: %w", i, err)
		}
		if cr.B2CFrames, err = countFrames(rec.B2C); err != nil {
			return fmt.Errorf("connection %d broker stream: %w", i, err)
		}
		for name, b := range map[string][]byte{cr.C2B: rec.C2B, cr.B2C: rec.B2C} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				return err
			}
		}
		m.Connections = append(m.Connections, cr)
	}
	var js strings.Builder
	enc := json.NewEncoder(&js)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(m); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(js.String()), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s/%s: %d connection(s) captured in %s\n", dirName, s.Name, len(m.Connections), dir)
	return nil
}

// countFrames reads a whole stream; a capture that does not parse to the
// last byte is an error (in the tool or in package wire).
func countFrames(b []byte) (map[string]int, error) {
	counts := map[string]int{}
	for len(b) > 0 {
		f, n, err := wire.ReadFrame(b, relayMaxMessageSize)
		if err != nil {
			return nil, fmt.Errorf("after %d frames: %w", len(counts), err)
		}
		counts[f.Type().String()]++
		b = b[n:]
	}
	return counts, nil
}

// runExternal runs a driver command through sh, substituting {url} and
// {topic} and appending the scenario's flags. Exit status 3 means the
// driver does not support the scenario.
func runExternal(ctx context.Context, command, url, topic string, s Scenario) error {
	command = strings.NewReplacer("{url}", shellQuote(url), "{topic}", shellQuote(topic)).Replace(command)
	for _, a := range s.Args() {
		command += " " + shellQuote(a)
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 3 {
		return errUnsupported
	}
	return err
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// setupPython creates the venv with the pinned pulsar-client when it does
// not exist yet, and returns the installed client version.
func setupPython(python, version string) (string, error) {
	if _, err := os.Stat(python); err != nil {
		venv := filepath.Dir(filepath.Dir(python))
		fmt.Fprintf(os.Stderr, "capture: creating %s with pulsar-client==%s\n", venv, version)
		for _, args := range [][]string{
			{"python3", "-m", "venv", venv},
			{filepath.Join(venv, "bin", "pip"), "install", "-q", "pulsar-client==" + version},
		} {
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				return "", fmt.Errorf("%s: %w", strings.Join(args, " "), err)
			}
		}
	}
	out, err := exec.Command(python, "-c", "import importlib.metadata as m; print(m.version('pulsar-client'))").Output()
	if err != nil {
		return "", fmt.Errorf("pulsar-client not importable from %s: %w", python, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// exposesBrokerEntryMetadata reads the broker's runtime configuration.
func exposesBrokerEntryMetadata(admin string) (bool, error) {
	js, err := httpGet(admin + "/admin/v2/brokers/configuration/runtime")
	if err != nil {
		return false, err
	}
	var conf map[string]string
	if err := json.Unmarshal([]byte(js), &conf); err != nil {
		return false, fmt.Errorf("runtime configuration: %w", err)
	}
	return conf["exposingBrokerEntryMetadataToClientEnabled"] == "true" &&
		strings.Trim(conf["brokerEntryMetadataInterceptors"], "[] ") != "", nil
}

func httpGet(url string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(b)), nil
}
