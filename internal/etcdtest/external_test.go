package etcdtest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
)

// listedCPU reads etcd's CPU time as External.CPU did before it kept its
// files open: list the threads, open and read each schedstat.
func listedCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue
		}
		ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
		if err != nil {
			tb.Fatal(err)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// TestExternalCPUCountsEtcdsWork: the CPU time External.CPU reports grows
// with the work etcd is given and agrees with a fresh reading of every
// thread's schedstat.
func TestExternalCPUCountsEtcdsWork(t *testing.T) {
	e := etcdtest.StartExternal(t)
	cli := e.Client(t)
	before, err := e.CPU()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2000; i++ {
		if _, err := cli.Put(context.Background(), fmt.Sprintf("/k/%d", i), strings.Repeat("v", 512)); err != nil {
			t.Fatal(err)
		}
	}
	after, err := e.CPU()
	if err != nil {
		t.Fatal(err)
	}
	fresh := listedCPU(t, e.PID())
	if after-before < 10*time.Millisecond {
		t.Errorf("etcd used %v for 2,000 puts, want more than 10ms", after-before)
	}
	// Read moments apart from an idle etcd: within a few milliseconds
	// (a thread that exited in between counts in CPU, not in the fresh
	// reading).
	if d := fresh - after; d < -20*time.Millisecond || d > 20*time.Millisecond {
		t.Errorf("CPU says %v, a fresh reading of every thread %v", after, fresh)
	}
}

// BenchmarkExternalCPU: what one reading costs the process that takes it,
// kept open against listed afresh (how External.CPU read before).
func BenchmarkExternalCPU(b *testing.B) {
	e := etcdtest.StartExternal(b)
	b.Run("open-files", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := e.CPU(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("listed-each-time", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			listedCPU(b, e.PID())
		}
	})
}
