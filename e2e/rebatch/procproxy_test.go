package rebatch_test

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// Given the proxy process with a producer connected through it (one message sent),
// when the proxy is killed with SIGKILL and started again on the same port one second later,
// then the new process listens on that port and the producer's next send succeeds.
func TestProxyRestartsOnSamePortAfterKill9(t *testing.T) {
	b := harness.Default(t)
	ns := newNamespace(t, b, "restart")
	pp := harness.StartProcessProxy(t, b, fmt.Sprintf("policies:\n  - topics: %s/*\n    policy: coalesce\n", ns))
	c := newClient(t, pp.URL())
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: "persistent://" + ns + "/t", DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if _, err := prod.Send(ctxT(t, 30*time.Second), &pulsar.ProducerMessage{Payload: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	pp.Kill9()
	time.Sleep(time.Second)
	if err := pp.TryStart(); err != nil {
		t.Fatalf("restart on %s one second after kill -9: %v", pp.Listen(), err)
	}
	if _, err := prod.Send(ctxT(t, 60*time.Second), &pulsar.ProducerMessage{Payload: []byte("after")}); err != nil {
		t.Fatalf("send after the restart: %v", err)
	}
}

var lastSeqRE = regexp.MustCompile(`msg="producer rebatched".* last_sequence_id=(-?\d+)`)

// lastLoggedSequenceID returns the last_sequence_id of the last producer p logged as
// rebatched, or -2 when there is none.
func lastLoggedSequenceID(p *harness.ProcessProxy) int64 {
	log, err := os.ReadFile(p.LogPath)
	if err != nil {
		return -2
	}
	m := lastSeqRE.FindAllSubmatch(log, -1)
	if len(m) == 0 {
		return -2
	}
	v, err := strconv.ParseInt(string(m[len(m)-1][1]), 10, 64)
	if err != nil {
		return -2
	}
	return v
}
