package keyshared

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// Range is an inclusive hash range of KeySharedMeta.hashRanges.
type Range struct{ Start, End int32 }

// Ring is the bucket layout of a topic (route.Buckets).
type Ring interface {
	Len() int
	Range(i int) (min, max uint16)
}

// Member is one client consumer as the manager drives it. The manager calls these without
// its lock held; see the package doc for the goroutine.
type Member interface {
	// Grant lets the member subscribe at the broker with ranges (its client's held SUBSCRIBE,
	// rewritten). The member then calls Ticket.Subscribed or Ticket.Failed.
	Grant(ranges []Range)
	// Release asks the member to give up what it holds at the broker (contract 3); it calls
	// Ticket.Released once the broker has closed it.
	Release()
	// Refuse tells the member it gets no ranges; it answers its client's subscribe with an
	// error carrying reason. The ticket is dead.
	Refuse(reason string)
}

// Identity names a client consumer so that its resubscribe after a release finds its place.
type Identity struct {
	ConsumerID uint64
	Name       string
}

// Config tunes a Manager.
type Config struct {
	// AwayTimeout is how long a released consumer keeps its place (contract 4); 0 means 10 s.
	AwayTimeout time.Duration
	Log         *slog.Logger
}

// Manager holds the managed subscriptions of one proxy process.
type Manager struct {
	cfg    Config
	mu     sync.Mutex
	groups map[groupKey]*group
	order  uint64
	stats  Stats
}

// Stats counts the manager's work; read them with Manager.Stats.
type Stats struct {
	Joins, Grants, Releases, Refusals, Leaves, AwayExpired uint64
}

type groupKey struct{ topic, sub string }

type group struct {
	key     groupKey
	ring    Ring
	members []*member
}

type state uint8

const (
	waiting   state = iota // its client's SUBSCRIBE is held until its block is free
	holding                // granted: subscribed (or subscribing) at the broker with granted
	releasing              // asked to release; still holds granted at the broker
	away                   // released; keeps its place until it resubscribes or AwayTimeout
)

var stateNames = [...]string{"waiting", "holding", "releasing", "away"}

type member struct {
	id      Identity
	mem     Member
	ticket  *Ticket
	order   uint64
	state   state
	target  []int // bucket block [lo, hi); nil: none
	granted []int // the block held at the broker; nil: none
	timer   *time.Timer
}

// Ticket is a member's handle on the manager. A ticket dies when its member leaves, is
// refused, or is taken over by a resubscribe on another ticket; calls on a dead ticket do
// nothing. Any goroutine may call its methods.
type Ticket struct {
	m  *Manager
	g  *group
	mb *member
}

// NewManager returns an empty manager. Any goroutine may call it.
func NewManager(cfg Config) *Manager {
	if cfg.AwayTimeout <= 0 {
		cfg.AwayTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Manager{cfg: cfg, groups: map[groupKey]*group{}}
}

// Stats returns a copy of the counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// Join takes a client's managed SUBSCRIBE. A consumer released earlier (same identity, in
// the away state) takes its place back; anyone else joins at the end of the order. The member
// is then granted, or waits, or is refused, through its callbacks. ring is used when the
// group is new; a group keeps its ring until it empties (a policy reload takes effect then).
func (m *Manager) Join(topic, sub string, ring Ring, id Identity, mem Member) *Ticket {
	m.mu.Lock()
	k := groupKey{topic, sub}
	g := m.groups[k]
	if g == nil {
		g = &group{key: k, ring: ring}
		m.groups[k] = g
	}
	var mb *member
	for _, x := range g.members {
		if x.state == away && x.id == id {
			mb = x
			break
		}
	}
	if mb == nil {
		m.order++
		mb = &member{id: id, order: m.order}
		g.members = append(g.members, mb)
		m.stats.Joins++
	}
	if mb.timer != nil {
		mb.timer.Stop()
		mb.timer = nil
	}
	mb.mem, mb.state = mem, waiting
	t := &Ticket{m: m, g: g, mb: mb}
	mb.ticket = t
	acts := m.rebalance(g)
	m.mu.Unlock()
	acts.run()
	return t
}

// Subscribed records the broker's acceptance of a granted subscribe.
func (t *Ticket) Subscribed() {
	// Nothing changes: a grant already counts as held (the broker may accept it any moment).
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	if t.live() {
		t.m.cfg.Log.Debug("managed Key_Shared consumer subscribed", "topic", t.g.key.topic, "subscription", t.g.key.sub,
			"consumer", t.mb.id.Name, "ranges", rangesOf(t.g.ring, t.mb.granted))
	}
}

// Released records that the broker has closed the member after a Release, or on its own
// (a topic unload: the client resubscribes as after a release). The member keeps its place
// for AwayTimeout.
func (t *Ticket) Released() {
	m := t.m
	m.mu.Lock()
	if !t.live() {
		m.mu.Unlock()
		return
	}
	mb := t.mb
	mb.state, mb.granted, mb.mem = away, nil, nil
	g := t.g
	mb.timer = time.AfterFunc(m.cfg.AwayTimeout, func() { m.expire(g, mb) })
	acts := m.rebalance(g)
	m.mu.Unlock()
	acts.run()
}

// Leave removes the member: its client closed the consumer (and the broker confirmed), its
// connection closed, or the broker refused its subscribe for good. Whatever it held at the
// broker must be gone (or going with its connection).
func (t *Ticket) Leave() {
	m := t.m
	m.mu.Lock()
	if !t.live() {
		m.mu.Unlock()
		return
	}
	m.stats.Leaves++
	m.remove(t.g, t.mb)
	acts := m.rebalance(t.g)
	m.mu.Unlock()
	acts.run()
}

// live reports whether the ticket still speaks for its member. Called with the lock held.
func (t *Ticket) live() bool {
	return t.mb.ticket == t && t.m.groups[t.g.key] == t.g && contains(t.g.members, t.mb)
}

func contains(ms []*member, mb *member) bool {
	for _, x := range ms {
		if x == mb {
			return true
		}
	}
	return false
}

// expire removes a member that stayed away too long.
func (m *Manager) expire(g *group, mb *member) {
	m.mu.Lock()
	if mb.state != away || !contains(g.members, mb) || m.groups[g.key] != g {
		m.mu.Unlock()
		return
	}
	m.stats.AwayExpired++
	m.cfg.Log.Info("released Key_Shared consumer did not resubscribe; rebalancing without it", "topic", g.key.topic,
		"subscription", g.key.sub, "consumer", mb.id.Name, "after", m.cfg.AwayTimeout)
	m.remove(g, mb)
	acts := m.rebalance(g)
	m.mu.Unlock()
	acts.run()
}

// remove drops mb from g (and g from the manager when empty). Called with the lock held.
func (m *Manager) remove(g *group, mb *member) {
	for i, x := range g.members {
		if x == mb {
			g.members = append(g.members[:i], g.members[i+1:]...)
			break
		}
	}
	if mb.timer != nil {
		mb.timer.Stop()
	}
	mb.ticket = nil
	if len(g.members) == 0 {
		delete(m.groups, g.key)
	}
}

// action is a member callback to make once the lock is released.
type action func()

type actions []action

func (a actions) run() {
	for _, f := range a {
		f()
	}
}

// rebalance recomputes every member's block and moves the group towards it: members holding
// another block are released, waiting members whose block is free are granted, waiting members
// left without a block are refused. Called with the lock held.
func (m *Manager) rebalance(g *group) actions {
	var acts actions
	sort.SliceStable(g.members, func(i, j int) bool { return g.members[i].order < g.members[j].order })
	n := g.ring.Len()
	k := min(len(g.members), n)
	for i, mb := range g.members {
		mb.target = nil
		if i < k {
			mb.target = []int{i * n / k, (i + 1) * n / k}
		}
	}
	for _, mb := range append([]*member(nil), g.members...) {
		switch mb.state {
		case holding:
			if !sameBlock(mb.granted, mb.target) {
				mb.state = releasing
				m.stats.Releases++
				mem := mb.mem
				m.cfg.Log.Info("rebalancing a managed Key_Shared subscription: releasing a consumer", "topic", g.key.topic,
					"subscription", g.key.sub, "consumer", mb.id.Name, "consumers", len(g.members),
					"from", rangesOf(g.ring, mb.granted), "to", rangesOf(g.ring, mb.target))
				acts = append(acts, mem.Release)
			}
		case waiting:
			if mb.target == nil {
				m.stats.Refusals++
				mem := mb.mem
				reason := fmt.Sprintf("subscription %q of %s has %d buckets and %d consumers through this proxy already hold them all; a proxy-managed Key_Shared subscription takes at most one consumer per bucket",
					g.key.sub, g.key.topic, n, k)
				m.remove(g, mb)
				acts = append(acts, func() { mem.Refuse(reason) })
				continue
			}
			if m.free(g, mb) {
				mb.state, mb.granted = holding, mb.target
				m.stats.Grants++
				mem, r := mb.mem, rangesOf(g.ring, mb.target)
				acts = append(acts, func() { mem.Grant(r) })
			}
		}
	}
	return acts
}

// free reports whether no other member holds any bucket of mb's target at the broker.
func (m *Manager) free(g *group, mb *member) bool {
	for _, x := range g.members {
		if x != mb && x.granted != nil && x.granted[0] < mb.target[1] && mb.target[0] < x.granted[1] {
			return false
		}
	}
	return true
}

func sameBlock(a, b []int) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a[0] == b[0] && a[1] == b[1]
}

// rangesOf turns a bucket block [lo, hi) into its one hash range.
func rangesOf(ring Ring, block []int) []Range {
	if block == nil {
		return nil
	}
	lo, _ := ring.Range(block[0])
	_, hi := ring.Range(block[1] - 1)
	return []Range{{Start: int32(lo), End: int32(hi)}}
}

// Snapshot describes a group for logs and tests: each member's name, state and block.
func (m *Manager) Snapshot(topic, sub string) []MemberState {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[groupKey{topic, sub}]
	if g == nil {
		return nil
	}
	out := make([]MemberState, 0, len(g.members))
	for _, mb := range g.members {
		out = append(out, MemberState{Name: mb.id.Name, State: stateNames[mb.state],
			Target: rangesOf(g.ring, mb.target), Granted: rangesOf(g.ring, mb.granted)})
	}
	return out
}

// MemberState is one member in a Snapshot.
type MemberState struct {
	Name            string
	State           string
	Target, Granted []Range
}
