package proxy

import (
	"os"
	"runtime"
)

// How many event loops, and how many Ps for them.
//
// An event loop waits for its sockets in epoll_wait, a raw system call during which the loop's
// goroutine keeps its P. When no other P is idle, Go's monitor thread (sysmon) takes that P
// back 20 us into each wait and, having found one to take, polls again 20 us later rather
// than backing off; the loop, woken, must win a P back. With two Ps or more, a P left idle by
// a quiet loop is enough for sysmon to leave a wait alone. With one P (one CPU, or a CPU quota
// of one, which Go 1.25 and later turn into GOMAXPROCS 1) every small request and response
// pays for it: on one core of its own, our proxy spent 236 ms of CPU per 1000 synchronous
// sends with GOMAXPROCS 1 and 145 ms with GOMAXPROCS 2, one loop both times (e2e/proxy/bench
// -pin, session 29).

// sizeRuntime returns the event loops to run for the configured number (0: one per P,
// GOMAXPROCS, which follows the CPUs the process may use and its CPU quota; gnet's own default
// is one per CPU of the machine, more loops than Ps under a quota) and, when GOMAXPROCS is 1
// and the environment does not set it, raises it to 2 so that a P stays idle while the loop
// waits. The second P runs no loop; it mostly runs nothing.
//
// Which goroutine: Serve's, before gnet.Run. It changes the process's GOMAXPROCS, which also
// stops the runtime from following later changes of the CPU quota.
func sizeRuntime(eventLoops int) int {
	if eventLoops == 0 {
		eventLoops = runtime.GOMAXPROCS(0)
	}
	if runtime.GOMAXPROCS(0) == 1 && os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(2)
	}
	return eventLoops
}
