package proxy

import (
	"testing"
	"time"
)

func TestLogEveryLetsOneLinePerIntervalCarryTheCount(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var l logEvery
	for _, step := range []struct {
		at         time.Duration
		ok         bool
		suppressed int
	}{
		{0, true, 0},
		{time.Second, false, 0},
		{logInterval - time.Nanosecond, false, 0},
		{logInterval, true, 2},
		{logInterval + time.Second, false, 0},
		{3 * logInterval, true, 1},
		{5 * logInterval, true, 0},
	} {
		ok, n := l.allow(t0.Add(step.at))
		if ok != step.ok || n != step.suppressed {
			t.Fatalf("at %v: allow = %v, %d; want %v, %d", step.at, ok, n, step.ok, step.suppressed)
		}
	}
}
