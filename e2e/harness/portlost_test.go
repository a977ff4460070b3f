package harness

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
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

// boundPort binds a TCP socket to a free loopback port without listening on it and without
// SO_REUSEADDR: a connection to the port is refused, so it looks free, but nobody else can bind
// it (as when another process takes the port between a check and a bind).
func boundPort(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

// listeningPort listens on a free loopback port.
func listeningPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// Given the broker port pulsar.sh is told to use taken by another socket, one that listens (seen by
// pulsar.sh's own check) or one that is only bound (seen when the broker binds it),
// when pulsar.sh starts a broker,
// then the start fails with pulsar.sh's port-lost status, which StartBroker retries on new ports,
// and not with the status of any other failure, which it returns at once.
func TestPulsarShReportsATakenPortAsPortLost(t *testing.T) {
	for name, take := range map[string]func(*testing.T) int{
		"listening, before the start": listeningPort,
		"bound, as the broker binds":  boundPort,
	} {
		t.Run(name, func(t *testing.T) {
			webPort, err := FreePort()
			if err != nil {
				t.Fatal(err)
			}
			port := take(t)
			env := append(os.Environ(), fmt.Sprintf("PULSAR_INSTANCE=portlost-%d-%d", os.Getpid(), port), "PULSAR_AUTH=none",
				"PULSAR_BROKER_PORT="+strconv.Itoa(port), "PULSAR_WEB_PORT="+strconv.Itoa(webPort))
			t.Cleanup(func() {
				stop := exec.Command(script(), "stop")
				stop.Env = env
				_ = stop.Run()
			})
			start := exec.Command(script(), "start")
			start.Env = env
			var out bytes.Buffer
			start.Stdout, start.Stderr = &out, &out

			err = start.Run()

			if !portLost(err) {
				t.Fatalf("pulsar.sh start ended with %v, want exit status %d; its output:\n%s", err, portLostStatus, out.String())
			}
		})
	}
}
