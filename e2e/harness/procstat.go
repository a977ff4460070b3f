package harness

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat (100 on Linux).
const clockTicks = 100

// ProcCPU returns the user plus system CPU time of process pid (all its threads) so far, from
// /proc/<pid>/stat.
func ProcCPU(pid int) (time.Duration, error) {
	user, sys, err := ProcCPUSplit(pid)
	return user + sys, err
}

// ProcCPUSplit returns the user and the system (kernel) CPU time of process pid (all its
// threads) so far, from /proc/<pid>/stat. The system part is what the kernel did on the
// process's behalf: for a proxy on loopback, mostly the TCP path of its reads and writes, which
// no user-space change removes except by making fewer calls.
func ProcCPUSplit(pid int) (user, sys time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name (in parentheses, and it may hold spaces): state is field 3,
	// utime 14 and stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("unparsable /proc/%d/stat: %q", pid, s)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("unparsable /proc/%d/stat: %q", pid, s)
	}
	return time.Duration(ut) * time.Second / clockTicks, time.Duration(st) * time.Second / clockTicks, nil
}

// MachineCPU returns the CPU time all of the machine's cores spent busy so far (user, nice,
// system, irq, softirq and steal: everything but idle and iowait), and the number of cores, from
// /proc/stat. A benchmark whose processes share the machine reads it around a run: busy time
// over the run's wall time and cores says whether the machine was saturated, and then
// throughput is the cores over the machine's CPU per message, whatever process spends it.
func MachineCPU() (busy time.Duration, cores int, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseProcStat(string(b))
}

// parseProcStat reads the aggregate "cpu" line of /proc/stat (its first) and counts the
// per-core "cpuN" lines.
func parseProcStat(s string) (busy time.Duration, cores int, err error) {
	var ticks int64
	found := false
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		if f[0] != "cpu" {
			cores++
			continue
		}
		// user nice system idle iowait irq softirq steal [guest guest_nice, already in user and nice]
		if len(f) < 9 {
			return 0, 0, fmt.Errorf("unparsable /proc/stat line %q", line)
		}
		for i, v := range f[1:9] {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("unparsable /proc/stat line %q", line)
			}
			if i != 3 && i != 4 { // idle, iowait
				ticks += n
			}
		}
		found = true
	}
	if !found || cores == 0 {
		return 0, 0, errors.New("/proc/stat has no cpu lines")
	}
	return time.Duration(ticks) * time.Second / clockTicks, cores, nil
}

// WaitListening reads a child process's standard output until it prints "listening ADDR" and
// returns ADDR; exited is closed when the process ends. It fails when the process ends first or
// within passes without the line. The rest of the output is read and discarded.
func WaitListening(out io.Reader, exited <-chan struct{}, within time.Duration) (string, error) {
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				select {
				case addr <- a:
				default:
				}
			}
		}
	}()
	select {
	case a := <-addr:
		return a, nil
	case <-exited:
		return "", errors.New("exited before listening")
	case <-time.After(within):
		return "", fmt.Errorf("not listening after %v", within)
	}
}
