package harness

import (
	"fmt"
	"net"

	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
)

// ClientLogger is a pulsar-client-go logger that prints only at level and above, so test output
// shows the client's warnings and errors, not its connection chatter.
func ClientLogger(level logrus.Level) plog.Logger {
	l := logrus.New()
	l.SetLevel(level)
	return plog.NewLoggerWithLogrus(l)
}

// FreePort returns a TCP port on 127.0.0.1 nobody listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
