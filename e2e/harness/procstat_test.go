package harness

import (
	"os"
	"strings"
	"testing"
	"time"
)

// Given this process, which has run code,
// when its CPU time is read twice around some work,
// then the second reading is at least the first, and a process that does not exist is an error.
func TestProcCPUReadsAProcessesCPUTime(t *testing.T) {
	before, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Millisecond); time.Now().Before(end); {
	}

	after, err := ProcCPU(os.Getpid())

	if err != nil || after < before {
		t.Fatalf("before %v, after %v, %v", before, after, err)
	}
	if _, err := ProcCPU(1 << 30); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}

// Given a child's output,
// when it prints its address after other lines, ends without printing it, or stays silent,
// then WaitListening returns the address, or says it exited, or says it timed out.
func TestWaitListening(t *testing.T) {
	open := make(chan struct{})
	closed := make(chan struct{})
	close(closed)
	for _, tc := range []struct {
		name, out string
		exited    chan struct{}
		want, err string
	}{
		{"listens", "starting\nlistening 127.0.0.1:7000\nmore\n", open, "127.0.0.1:7000", ""},
		{"exits", "starting\n", closed, "", "exited before listening"},
		{"silent", "", open, "", "not listening after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := WaitListening(strings.NewReader(tc.out), tc.exited, 100*time.Millisecond)

			if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("got %q, %v; want %q, %q", got, err, tc.want, tc.err)
			}
		})
	}
}
