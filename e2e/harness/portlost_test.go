package harness

import (
	"fmt"
	"os/exec"
	"testing"
)

// Given pulsar.sh starts that failed in different ways,
// when StartBroker asks whether a failed start lost a port,
// then only a start that exited with pulsar.sh's port-lost status says so, wrapped or not.
func TestPortLostIsPulsarShsExitStatus(t *testing.T) {
	exit := func(code int) error { return exec.Command("sh", "-c", fmt.Sprintf("exit %d", code)).Run() }
	cases := map[string]struct {
		err  error
		want bool
	}{
		"port lost":         {exit(portLostStatus), true},
		"port lost wrapped": {fmt.Errorf("pulsar.sh start: %w", exit(portLostStatus)), true},
		"other failure":     {exit(2), false},
		"not an exit":       {fmt.Errorf("harness: TLSAuth needs TLS"), false},
	}
	for name, c := range cases {
		if got := portLost(c.err); got != c.want {
			t.Errorf("%s: portLost = %v, want %v", name, got, c.want)
		}
	}
}
