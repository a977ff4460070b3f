package proxy

import (
	"os"
	"runtime"
	"testing"
)

// Given GOMAXPROCS and its environment variable, when SizeRuntime sizes the event loops, then
// 0 loops means one per P, and a single P is raised to two unless the environment set it.
func TestSizeRuntime(t *testing.T) {
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
			got := SizeRuntime(c.loops)
			if got != c.wantLoops || runtime.GOMAXPROCS(0) != c.wantPs {
				t.Errorf("SizeRuntime(%d) with GOMAXPROCS %d: %d loops, GOMAXPROCS %d; want %d loops, GOMAXPROCS %d",
					c.loops, c.procs, got, runtime.GOMAXPROCS(0), c.wantLoops, c.wantPs)
			}
		})
	}
}
