package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// -pin gives the proxies a core of their own.
//
// On a machine of two cores the broker, the client and a proxy share both, so whatever a proxy
// spends is taken from the broker and the client, and a proxy's throughput over direct measures
// the machine's spare CPU as much as the proxy. With -pin the broker and this process (the
// client) run on the first CPU and the proxies on the second, for every target, direct
// included: the broker and the client have the same core whichever way their traffic goes, as
// when a proxy runs on a host of its own. The kernel's loopback path runs in the context of the
// process that writes, so each core also carries the receiving half of the writes made on it.
//
// The proxies are started on the first CPU's mask (so each sizes itself, GOMAXPROCS and Netty's
// threads, for one core) and moved with all their threads; every thread is moved again before
// each measured run, so a thread made meanwhile by one not yet moved is caught too. The broker's
// threads get their old mask back when the bench ends.

// pinned is set by -pin: the CPU sets, and the broker's mask before the bench changed it.
var pinned struct {
	on                bool
	cpus              [2]int // the client's and the broker's CPU, the proxies' CPU
	clientAndBroker   unix.CPUSet
	proxies           unix.CPUSet
	brokerWas         unix.CPUSet
	restoreBrokerOnce sync.Once
}

// pinStart pins this process and the broker (pid) to the first CPU this process may use and
// chooses the second for the proxies. Which goroutine: main, before any proxy starts.
func pinStart(brokerPID int) error {
	if brokerPID == 0 {
		return fmt.Errorf("-pin needs the broker's pid (-broker-pid, or -tls, which starts its own broker)")
	}
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		return fmt.Errorf("-pin: reading this process's CPU mask: %w", err)
	}
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < 2; c++ {
		if mine.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		return fmt.Errorf("-pin needs two CPUs, this process may use %d", mine.Count())
	}
	if err := unix.SchedGetaffinity(brokerPID, &pinned.brokerWas); err != nil {
		return fmt.Errorf("-pin: reading the broker's CPU mask (pid %d): %w", brokerPID, err)
	}
	pinned.cpus = [2]int{cpus[0], cpus[1]}
	pinned.clientAndBroker.Set(cpus[0])
	pinned.proxies.Set(cpus[1])
	pinned.on = true
	if err := setAffinity(os.Getpid(), &pinned.clientAndBroker); err != nil {
		return fmt.Errorf("-pin: this process: %w", err)
	}
	if err := setAffinity(brokerPID, &pinned.clientAndBroker); err != nil {
		return fmt.Errorf("-pin: the broker (pid %d): %w", brokerPID, err)
	}
	return nil
}

// pinAgain moves every thread of the broker and this process to the first CPU and every thread
// of each proxy (pids) to the second. Which goroutine: main, between runs.
func pinAgain(brokerPID int, proxies []int) error {
	if !pinned.on {
		return nil
	}
	for _, pid := range []int{os.Getpid(), brokerPID} {
		if err := setAffinity(pid, &pinned.clientAndBroker); err != nil {
			return fmt.Errorf("-pin: pid %d: %w", pid, err)
		}
	}
	for _, pid := range proxies {
		if err := setAffinity(pid, &pinned.proxies); err != nil {
			return fmt.Errorf("-pin: proxy pid %d: %w", pid, err)
		}
	}
	return nil
}

// unpinBroker gives the broker's threads back the mask they had. Which goroutine: any; once.
func unpinBroker(brokerPID int) {
	if !pinned.on {
		return
	}
	pinned.restoreBrokerOnce.Do(func() { _ = setAffinity(brokerPID, &pinned.brokerWas) })
}

// pinDescription names the placement for the run's header ("" without -pin).
func pinDescription() string {
	if !pinned.on {
		return ""
	}
	return fmt.Sprintf("; pinned: broker and client on CPU %d, proxies on CPU %d", pinned.cpus[0], pinned.cpus[1])
}

// setAffinity sets the CPU mask of every thread of process pid. A thread that exits meanwhile
// is skipped.
func setAffinity(pid int, set *unix.CPUSet) error {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	return nil
}
