package keyshared

import (
	"fmt"
	"math/rand"
	"reflect"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/route"
)

// fakeMember records the manager's callbacks.
type fakeMember struct {
	name     string
	granted  [][]Range
	released int
	refused  string
}

func (f *fakeMember) Grant(r []Range)      { f.granted = append(f.granted, r) }
func (f *fakeMember) Release()             { f.released++ }
func (f *fakeMember) Refuse(reason string) { f.refused = reason }

func (f *fakeMember) last() []Range {
	if len(f.granted) == 0 {
		return nil
	}
	return f.granted[len(f.granted)-1]
}

func ring(t *testing.T, n int) *route.Buckets {
	t.Helper()
	r, err := route.NewEqualBuckets(n)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func join(m *Manager, r Ring, name string) (*fakeMember, *Ticket) {
	f := &fakeMember{name: name}
	return f, m.Join("t", "s", r, Identity{ConsumerID: 1, Name: name}, f)
}

func TestFirstConsumerGetsEveryBucket(t *testing.T) {
	// Given an empty manager and a topic of 4 buckets
	m := NewManager(Config{})
	// When one consumer subscribes
	a, _ := join(m, ring(t, 4), "a")
	// Then it is granted the whole hash range at once
	if want := []Range{{0, 65535}}; !reflect.DeepEqual(a.last(), want) {
		t.Fatalf("granted %v, want %v", a.granted, want)
	}
}

func TestJoinReleasesTheHolderAndGrantsOnlyFreedBuckets(t *testing.T) {
	// Given a consumer holding all 4 buckets
	m := NewManager(Config{})
	r := ring(t, 4)
	a, ta := join(m, r, "a")
	ta.Subscribed()
	// When a second consumer subscribes
	b, _ := join(m, r, "b")
	// Then the first is asked to release and the second waits, granted nothing yet
	if a.released != 1 || len(b.granted) != 0 {
		t.Fatalf("a released %d times, b granted %v; want 1 and nothing", a.released, b.granted)
	}
	// and once the first has released, the second gets the upper half
	ta.Released()
	if want := []Range{{32768, 65535}}; !reflect.DeepEqual(b.last(), want) {
		t.Fatalf("b granted %v, want %v", b.granted, want)
	}
	// and the first, resubscribing under its identity, gets the lower half back
	a2, _ := join(m, r, "a")
	if want := []Range{{0, 32767}}; !reflect.DeepEqual(a2.last(), want) {
		t.Fatalf("a's resubscribe granted %v, want %v", a2.granted, want)
	}
	if st := m.Stats(); st.Joins != 2 {
		t.Fatalf("joins %d, want 2 (a resubscribe is not a join)", st.Joins)
	}
}

func TestLeaveHandsTheBucketsToTheSurvivors(t *testing.T) {
	// Given three settled consumers over 6 buckets
	m := NewManager(Config{})
	r := ring(t, 6)
	fs, ts := settle(t, m, r, "a", "b", "c")
	// When the middle one leaves
	ts[1].Leave()
	// Then both survivors are released (their blocks grow) and, resubscribed, split the ring
	if fs[0].released != 1 || fs[2].released != 1 {
		t.Fatalf("releases a=%d c=%d, want 1 and 1", fs[0].released, fs[2].released)
	}
	ts[0].Released()
	ts[2].Released()
	a, _ := join(m, r, "a")
	c, _ := join(m, r, "c")
	if !reflect.DeepEqual(a.last(), []Range{{0, 32767}}) || !reflect.DeepEqual(c.last(), []Range{{32768, 65535}}) {
		t.Fatalf("a %v, c %v; want the two halves", a.granted, c.granted)
	}
}

func TestMoreConsumersThanBucketsAreRefused(t *testing.T) {
	// Given two settled consumers over 2 buckets
	m := NewManager(Config{})
	r := ring(t, 2)
	settle(t, m, r, "a", "b")
	// When a third subscribes
	c, _ := join(m, r, "c")
	// Then it is refused with a reason naming the bucket count, and nobody is released
	if c.refused == "" || len(c.granted) != 0 {
		t.Fatalf("c refused %q, granted %v; want a refusal", c.refused, c.granted)
	}
	if snap := m.Snapshot("t", "s"); len(snap) != 2 {
		t.Fatalf("group has %d members, want 2", len(snap))
	}
}

func TestAConsumerThatDoesNotComeBackLosesItsPlace(t *testing.T) {
	// Given two settled consumers and a short away timeout
	m := NewManager(Config{AwayTimeout: 20 * time.Millisecond})
	r := ring(t, 4)
	fs, ts := settle(t, m, r, "a", "b")
	// When one is released by the broker (a topic unload) and never resubscribes
	ts[0].Released()
	time.Sleep(100 * time.Millisecond)
	// Then the other is released to take the whole ring and, resubscribed, gets it
	if fs[1].released != 1 {
		t.Fatalf("b released %d times, want 1", fs[1].released)
	}
	ts[1].Released()
	b, _ := join(m, r, "b")
	if !reflect.DeepEqual(b.last(), []Range{{0, 65535}}) {
		t.Fatalf("b granted %v, want the whole ring", b.granted)
	}
	if m.Stats().AwayExpired != 1 {
		t.Fatalf("stats %+v, want one expiry", m.Stats())
	}
}

// settle joins the named consumers one by one, driving each handoff to completion.
func settle(t *testing.T, m *Manager, r Ring, names ...string) ([]*fakeMember, []*Ticket) {
	t.Helper()
	fs := make([]*fakeMember, len(names))
	ts := make([]*Ticket, len(names))
	for i, n := range names {
		fs[i], ts[i] = join(m, r, n)
		for j := 0; j < i; j++ {
			if fs[j].released > 0 {
				ts[j].Released()
				fs[j], ts[j] = join(m, r, names[j])
			}
		}
	}
	for i, f := range fs {
		if f.last() == nil {
			t.Fatalf("%s was not granted after settling", names[i])
		}
	}
	return fs, ts
}

// TestHandoffsNeverGrantABucketTwice drives random joins, leaves, releases and resubscribes
// and checks the ownership contract after every step: no bucket granted to two members at
// once, every grant a block of the current balanced assignment, and once everyone released
// has resubscribed, every bucket held.
func TestHandoffsNeverGrantABucketTwice(t *testing.T) {
	for seed := int64(0); seed < 300; seed++ {
		rnd := rand.New(rand.NewSource(seed))
		m := NewManager(Config{AwayTimeout: time.Hour})
		r := ring(t, 1+rnd.Intn(8))
		type live struct {
			name string
			f    *fakeMember
			t    *Ticket
			seen int // releases already answered
		}
		var ls []*live
		next := 0
		for step := 0; step < 40; step++ {
			switch op := rnd.Intn(4); {
			case op == 0 || len(ls) == 0:
				f, tk := join(m, r, fmt.Sprint("c", next))
				next++
				if f.refused == "" {
					ls = append(ls, &live{name: f.name, f: f, t: tk})
				}
			case op == 1:
				i := rnd.Intn(len(ls))
				ls[i].t.Leave()
				ls = append(ls[:i], ls[i+1:]...)
			default: // answer one pending release: the broker closed it, the client resubscribes
				for _, l := range ls {
					if l.f.released > l.seen {
						l.seen = l.f.released
						l.t.Released()
						if rnd.Intn(2) == 0 { // sometimes the resubscribe comes later
							l.f, l.t = join(m, r, l.name)
							l.seen = 0
						}
						break
					}
				}
			}
			checkNoOverlap(t, seed, m)
		}
		// Settle: every release answered, every away member back.
		for round := 0; round < 50; round++ {
			progressed := false
			for _, l := range ls {
				st := stateOf(m, l.name)
				if l.f.released > l.seen {
					l.seen = l.f.released
					l.t.Released()
					progressed = true
				}
				if st == "away" || stateOf(m, l.name) == "away" {
					l.f, l.t = join(m, r, l.name)
					l.seen = 0
					progressed = true
				}
			}
			checkNoOverlap(t, seed, m)
			if !progressed {
				break
			}
		}
		covered := 0
		for _, s := range m.Snapshot("t", "s") {
			if s.State != "holding" || !reflect.DeepEqual(s.Granted, s.Target) {
				t.Fatalf("seed %d: after settling %s is %s holding %v, target %v", seed, s.Name, s.State, s.Granted, s.Target)
			}
			covered += int(s.Granted[0].End-s.Granted[0].Start) + 1
		}
		if len(ls) > 0 && covered != 65536 {
			t.Fatalf("seed %d: %d hashes held after settling, want 65536", seed, covered)
		}
	}
}

func stateOf(m *Manager, name string) string {
	for _, s := range m.Snapshot("t", "s") {
		if s.Name == name {
			return s.State
		}
	}
	return ""
}

func checkNoOverlap(t *testing.T, seed int64, m *Manager) {
	t.Helper()
	snap := m.Snapshot("t", "s")
	for i, a := range snap {
		for _, b := range snap[i+1:] {
			if a.Granted != nil && b.Granted != nil && a.Granted[0].Start <= b.Granted[0].End && b.Granted[0].Start <= a.Granted[0].End {
				t.Fatalf("seed %d: %s holds %v and %s holds %v at once", seed, a.Name, a.Granted, b.Name, b.Granted)
			}
		}
	}
}
