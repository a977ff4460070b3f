package harness

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogBuffer collects log lines (an in-process proxy's, say) for assertions and failure
// reports. Any goroutine may call its methods.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// WaitFor fails the test unless s appears in the log within five seconds.
func (l *LogBuffer) WaitFor(t testing.TB, s string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(l.String(), s) {
			return
		}
	}
	t.Fatalf("log has no %q:\n%s", s, l.String())
}
