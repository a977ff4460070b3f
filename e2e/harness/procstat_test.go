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

// Given /proc/stat texts,
// when they are parsed,
// then busy time counts every column but idle and iowait, cores are the per-core lines, and a
// text without the aggregate line or with a short one is an error.
func TestParseProcStatCountsBusyTimeAndCores(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		busy       time.Duration
		cores      int
		err        bool
	}{
		{"two cores", "cpu  100 2 30 5000 40 1 7 9 0 0\ncpu0 50 1 15 2500 20 0 3 4 0 0\ncpu1 50 1 15 2500 20 1 4 5 0 0\nintr 1 2\n",
			149 * time.Second / 100, 2, false},
		{"no aggregate line", "cpu0 1 2 3 4 5 6 7 8\n", 0, 0, true},
		{"short line", "cpu 1 2 3\ncpu0 1 2 3\n", 0, 0, true},
		{"empty", "", 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			busy, cores, err := parseProcStat(tc.text)

			if (err != nil) != tc.err || busy != tc.busy || cores != tc.cores {
				t.Fatalf("got %v, %d, %v; want %v, %d, error %v", busy, cores, err, tc.busy, tc.cores, tc.err)
			}
		})
	}
	if _, cores, err := MachineCPU(); err != nil || cores < 1 {
		t.Fatalf("this machine's /proc/stat: %d cores, %v", cores, err)
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
