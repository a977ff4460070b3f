package proxy

import (
	"os"
	"runtime"
	"testing"
)

// Given GOMAXPROCS and its environment variable, when Serve sizes the event loops (sizeRuntime), then
// 0 loops means one per P, and a single P is raised to two unless the environment set it.
func TestSizeRuntimeDefaults(t *testing.T) {
	cases := []struct {
		name              string
		procs, loops      int
		env               string // GOMAXPROCS in the environment; "" unset
		wantLoops, wantPs int
	}{
		{"one P, default loops", 1, 0, "", 1, 2},
		{"one P set by the environment", 1, 0, "1", 1, 1},
		{"one P, loops configured", 1, 3, "", 3, 2},
		{"four Ps, default loops", 4, 0, "", 4, 4},
		{"two Ps, one loop", 2, 1, "", 1, 2},
	}
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", c.env) // restored after the case
			if c.env == "" {
				if err := os.Unsetenv("GOMAXPROCS"); err != nil {
					t.Fatal(err)
				}
			}
			runtime.GOMAXPROCS(c.procs)
			got := sizeRuntime(c.loops)
			if got != c.wantLoops || runtime.GOMAXPROCS(0) != c.wantPs {
				t.Errorf("sizeRuntime(%d) with GOMAXPROCS %d: %d loops, GOMAXPROCS %d; want %d loops, GOMAXPROCS %d",
					c.loops, c.procs, got, runtime.GOMAXPROCS(0), c.wantLoops, c.wantPs)
			}
		})
	}
}

// Given a process with one P and no GOMAXPROCS in its environment, when a proxy with the
// default event loops serves, then it runs one loop and the process two Ps, as its start log
// says.
func TestServeKeepsASpareP(t *testing.T) {
	was := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	t.Setenv("GOMAXPROCS", "")
	if err := os.Unsetenv("GOMAXPROCS"); err != nil {
		t.Fatal(err)
	}
	_, _, logs := startProxy(t, []string{"127.0.0.1:1"}, func(c *Config) { c.EventLoops = 0 })
	logs.waitFor(t, "event_loops=1 gomaxprocs=2")
}
