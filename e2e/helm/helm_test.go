// Package helm checks the Helm chart in deploy/helm/pulsar-rebatch-proxy: helm lint, helm
// template, the rendered manifests decoded strictly with the Kubernetes API's Go types (unknown
// fields refused), the promises the chart makes (probes, drain within the grace period, the
// disruption budget and Service selecting the pods), and the rendered config and arguments run
// by the real proxy binary in front of a real broker.
package helm

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/sirupsen/logrus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

func chartDir() string {
	return filepath.Join(harness.RepoRoot(), "deploy", "helm", "pulsar-rebatch-proxy")
}

// helmBinary finds helm on PATH or in $(go env GOPATH)/bin, where .ci/run installs it.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(gopath)), "bin", "helm")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("helm is not installed: go install helm.sh/helm/v3/cmd/helm@v3.22.0 (.ci/run does)")
	return ""
}

// kubeVersion is the Kubernetes version charts are rendered for: the one of the k8s.io/api
// types the manifests are decoded with (helm built by go install otherwise assumes 1.20).
const kubeVersion = "1.32.0"

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	if args[0] == "template" || args[0] == "lint" {
		args = append(args, "--kube-version", kubeVersion)
	}
	cmd := exec.Command(helmBinary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), nil
}

// manifests is a rendered chart, decoded.
type manifests struct {
	deployment *appsv1.Deployment
	service    *corev1.Service
	configMap  *corev1.ConfigMap
	pdb        *policyv1.PodDisruptionBudget
}

// decode splits helm template's output into documents and decodes each strictly into the API
// type of its kind; a field the type does not have fails.
func decode(t *testing.T, rendered string) manifests {
	t.Helper()
	var m manifests
	var kinds []string
	for _, doc := range strings.Split(rendered, "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("a rendered document is not YAML: %v\n%s", err, doc)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			m.deployment = &appsv1.Deployment{}
			obj = m.deployment
		case "v1 Service":
			m.service = &corev1.Service{}
			obj = m.service
		case "v1 ConfigMap":
			m.configMap = &corev1.ConfigMap{}
			obj = m.configMap
		case "policy/v1 PodDisruptionBudget":
			m.pdb = &policyv1.PodDisruptionBudget{}
			obj = m.pdb
		default:
			t.Fatalf("unexpected kind %s %s in the rendered chart:\n%s", tm.APIVersion, tm.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s does not decode as the Kubernetes API's %T: %v\n%s", tm.Kind, obj, err, doc)
		}
		kinds = append(kinds, tm.Kind)
	}
	slices.Sort(kinds)
	if want := []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Service"}; !slices.Equal(kinds, want) {
		t.Fatalf("rendered kinds %v, want %v", kinds, want)
	}
	return m
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Given the chart,
// when helm lints it (strict) and renders it with its defaults,
// then lint passes and every manifest decodes as its Kubernetes API type.
func TestChartLintsAndRendersAsKubernetesTypes(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", chartDir()); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("helm lint: %s", strings.TrimSpace(out))
	}
	out, err := helm(t, "template", "rp", chartDir(), "--namespace", "pulsar")
	if err != nil {
		t.Fatal(err)
	}
	decode(t, out)
}

// Given the chart rendered with its defaults,
// when its manifests are read as Kubernetes would,
// then the Deployment probes /healthz and /readyz on the metrics port, its grace period covers
// the preStop sleep plus the proxy's drain timeout, it requests resources, the Service and the
// disruption budget select its pods, and the config volume is the rendered ConfigMap.
func TestChartKeepsItsPromises(t *testing.T) {
	out, err := helm(t, "template", "rp", chartDir(), "--namespace", "pulsar")
	if err != nil {
		t.Fatal(err)
	}
	m := decode(t, out)
	d := m.deployment
	pod := d.Spec.Template
	if !selects(d.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", d.Spec.Selector.MatchLabels, pod.Labels)
	}
	if !selects(m.service.Spec.Selector, pod.Labels) {
		t.Errorf("the Service's selector %v does not select the pods %v", m.service.Spec.Selector, pod.Labels)
	}
	if !selects(m.pdb.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("the PodDisruptionBudget's selector %v does not select the pods %v", m.pdb.Spec.Selector.MatchLabels, pod.Labels)
	}
	if m.pdb.Spec.MaxUnavailable == nil || m.pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1", m.pdb.Spec.MaxUnavailable)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas = %v, want several interchangeable instances", d.Spec.Replicas)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, probe := range []struct {
		name, path string
		p          *corev1.Probe
	}{{"liveness", "/healthz", c.LivenessProbe}, {"readiness", "/readyz", c.ReadinessProbe}} {
		if probe.p == nil || probe.p.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", probe.name)
			continue
		}
		if probe.p.HTTPGet.Path != probe.path || probe.p.HTTPGet.Port.String() != "metrics" || ports["metrics"] == 0 {
			t.Errorf("%s probe %s on port %s, want %s on the metrics port (ports %v)", probe.name, probe.p.HTTPGet.Path, probe.p.HTTPGet.Port.String(), probe.path, ports)
		}
	}
	drain := time.Duration(0)
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--drain-timeout="); ok {
			if drain, err = time.ParseDuration(v); err != nil {
				t.Fatalf("--drain-timeout %q: %v", v, err)
			}
		}
	}
	if drain == 0 {
		t.Fatalf("the container's args %v set no --drain-timeout", c.Args)
	}
	preStop := time.Duration(0)
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	if grace <= preStop+drain {
		t.Errorf("terminationGracePeriodSeconds %v does not cover the preStop sleep %v plus the drain %v", grace, preStop, drain)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
	}
	found := false
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == m.configMap.Name {
			found = true
		}
	}
	if !found || m.configMap.Data["proxy.yaml"] == "" {
		t.Errorf("no volume of ConfigMap %s with proxy.yaml (volumes %+v)", m.configMap.Name, pod.Spec.Volumes)
	}
	if pod.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a changed config would not roll the pods")
	}
	t.Logf("grace %v = preStop %v + drain %v + margin; %d replicas, PDB maxUnavailable %s",
		grace, preStop, drain, *d.Spec.Replicas, m.pdb.Spec.MaxUnavailable.String())
}

// Given the chart,
// when it is rendered without a broker URL,
// then helm refuses with the chart's own message.
func TestChartRefusesNoBrokerURL(t *testing.T) {
	out, err := helm(t, "template", "rp", chartDir(), "--set", "brokerURLs=null")
	if err == nil {
		t.Fatalf("helm template rendered a chart without a broker URL:\n%s", out)
	}
	if !strings.Contains(err.Error(), "brokerURLs: at least one") {
		t.Errorf("helm's refusal does not name brokerURLs: %v", err)
	}
}

// Given the chart rendered in front of a real broker,
// when the real proxy binary runs with the container's arguments and the ConfigMap's config file
// (addresses moved to loopback ports), and then gets SIGTERM,
// then it turns ready, carries a message through, and exits 0 within the pod's grace period.
func TestRenderedConfigRunsTheProxy(t *testing.T) {
	b := harness.Default(t)
	out, err := helm(t, "template", "rp", chartDir(), "--set", "brokerURLs={"+b.ServiceURL+"}")
	if err != nil {
		t.Fatal(err)
	}
	m := decode(t, out)
	dir := t.TempDir()
	mount := m.deployment.Spec.Template.Spec.Containers[0].VolumeMounts[0].MountPath
	cfg := filepath.Join(dir, "proxy.yaml")
	if err := os.WriteFile(cfg, []byte(m.configMap.Data["proxy.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	listen, metrics := harness.FreeAddr(t), harness.FreeAddr(t)
	var args []string
	for _, a := range m.deployment.Spec.Template.Spec.Containers[0].Args {
		switch {
		case strings.HasPrefix(a, "--config="):
			if !strings.HasPrefix(strings.TrimPrefix(a, "--config="), mount+"/") {
				t.Fatalf("%s is not under the config volume's mount %s", a, mount)
			}
			a = "--config=" + cfg
		case strings.HasPrefix(a, "--listen="):
			a = "--listen=" + listen
		case strings.HasPrefix(a, "--metrics-listen="):
			a = "--metrics-listen=" + metrics
		}
		args = append(args, a)
	}
	cmd := exec.Command(harness.ProxyBinary(t), args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	ready := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !ready; time.Sleep(100 * time.Millisecond) {
		if r, err := http.Get("http://" + metrics + "/readyz"); err == nil {
			ready = r.StatusCode == http.StatusOK
			r.Body.Close()
		}
	}
	if !ready {
		t.Fatalf("the proxy with the rendered arguments %v never became ready:\n%s", args, logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := fmt.Sprintf("persistent://public/default/helm-%d", time.Now().UnixNano())
	if err := roundTrip(ctx, "pulsar://"+listen, topic, 10); err != nil {
		t.Fatalf("messages through the proxy with the rendered config: %v\n%s", err, logs.String())
	}
	grace := time.Duration(*m.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the proxy exited with %v after SIGTERM:\n%s", err, logs.String())
		}
		t.Logf("ready, 10 messages through, SIGTERM: exited 0 after %v (grace period %v)", time.Since(start).Round(time.Millisecond), grace)
	case <-time.After(grace):
		t.Fatalf("the proxy did not exit within the grace period %v after SIGTERM:\n%s", grace, logs.String())
	}
}

// roundTrip produces n messages to a new topic through url and consumes them back in order.
func roundTrip(ctx context.Context, url, topic string, n int) error {
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: harness.ClientLogger(logrus.WarnLevel), OperationTimeout: 30 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "helm", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		return err
	}
	defer cons.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		return err
	}
	defer p.Close()
	for i := 0; i < n; i++ {
		if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))}); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	for i := 0; i < n; i++ {
		m, err := cons.Receive(ctx)
		if err != nil {
			return fmt.Errorf("receive %d: %w", i, err)
		}
		if string(m.Payload()) != fmt.Sprint(i) {
			return fmt.Errorf("message %d is %q", i, m.Payload())
		}
		_ = cons.Ack(m)
	}
	return nil
}
