package proxy

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// The net.Conn transport's executor: tasks run one at a time and in order,
// whoever runs them. A reader hands its input over on its own goroutine when
// the loop is free; what others queue meanwhile goes to the loop's goroutine.

// waitFor fails t unless ch is closed within 5 s.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestReaderInputRunsOnTheReadersGoroutineWhenTheLoopIsFree(t *testing.T) {
	// Given a free connection loop
	l := newConnLoop()
	l.mu.Lock()
	l.live = 1
	l.mu.Unlock()

	// When a reader hands it a task
	ran := false
	if err := l.runHere(func() { ran = true }); err != nil {
		t.Fatal(err)
	}

	// Then the task has run before runHere returned (no goroutine switch)
	if !ran {
		t.Fatal("the task did not run on the caller's goroutine")
	}
}

func TestTasksQueuedDuringAnInlineTaskRunAfterItInOrder(t *testing.T) {
	// Given a loop whose owner is a reader running a task inline
	l := newConnLoop()
	l.mu.Lock()
	l.live = 1
	l.mu.Unlock()
	var mu sync.Mutex
	var order []int
	note := func(i int) { mu.Lock(); order = append(order, i); mu.Unlock() }
	done := make(chan struct{})

	// When others queue tasks (by run and by another reader) while it runs
	_ = l.runHere(func() {
		note(1)
		_ = l.run(func() { note(2) })
		queued := make(chan struct{})
		go func() { _ = l.runHere(func() { note(3) }); close(queued) }()
		<-queued // the loop is owned: the other reader's task is queued, not run
		_ = l.run(func() { note(4); close(done) })
	})

	// Then they run after it, in the order they were queued, one at a time
	waitFor(t, done, "the queued tasks")
	mu.Lock()
	defer mu.Unlock()
	if want := []int{1, 2, 3, 4}; !slices.Equal(order, want) {
		t.Fatalf("order = %v, want %v", order, want)
	}
}

func TestRunNeverRunsTheTaskOnTheCallersGoroutine(t *testing.T) {
	// Given a free loop, and a task that waits for what its caller does after queuing it
	l := newConnLoop()
	l.mu.Lock()
	l.live = 1
	l.mu.Unlock()
	callerDone, ran := make(chan struct{}), make(chan struct{})
	returned := make(chan error, 1)

	// When the caller queues the task with run
	go func() { returned <- l.run(func() { <-callerDone; close(ran) }) }()

	// Then run returns before the task runs (run inline, it would wait for itself), and the task runs after
	select {
	case err := <-returned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run ran the task on the caller's goroutine")
	}
	close(callerDone)
	waitFor(t, ran, "the task")
}

func TestTheLoopStopsWithItsLastConnectionAndRefusesTasksAfter(t *testing.T) {
	// Given a loop with one connection
	l := newConnLoop()
	l.mu.Lock()
	l.live = 1
	l.mu.Unlock()

	// When a reader's task finishes that connection
	_ = l.runHere(func() { l.mu.Lock(); l.live--; l.mu.Unlock() })

	// Then the loop is stopped: tasks are refused by both calls, its goroutine ended
	if err := l.run(func() {}); err != errLoopStopped {
		t.Fatalf("run after the last connection: %v, want errLoopStopped", err)
	}
	if err := l.runHere(func() {}); err != errLoopStopped {
		t.Fatalf("runHere after the last connection: %v, want errLoopStopped", err)
	}
	if _, open := <-l.wake; open {
		t.Fatal("the wake channel is open: the loop's goroutine would leak")
	}
}
