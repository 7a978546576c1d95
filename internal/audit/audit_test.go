package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func open(t *testing.T, o Options) *Log {
	t.Helper()
	l, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestRotateAndRead: past MaxBytes the file rotates, at most Keep old
// files are kept, and Read returns the newest matches across them, oldest
// first, saying when more matched.
func TestRotateAndRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "audit.jsonl")
	l := open(t, Options{Path: path, MaxBytes: 2000, Keep: 3})
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const n = 200
	for i := range n {
		if err := l.Write(Record{Time: t0.Add(time.Duration(i) * time.Second), Actor: "ada", Action: "session.create", Target: fmt.Sprint(i), Outcome: OK}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 3; i++ {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", path, i)); err != nil {
			t.Errorf("rotated file %d: %v", i, err)
		}
	}
	if _, err := os.Stat(path + ".4"); err == nil {
		t.Error("kept a fourth rotated file with Keep 3")
	}
	for _, p := range []string{path, path + ".1"} {
		if st, _ := os.Stat(p); st.Size() > 2000 {
			t.Errorf("%s is %d bytes, over MaxBytes", p, st.Size())
		}
	}
	all, _, err := l.Read(Filter{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 || len(all) >= n || all[len(all)-1].Target != fmt.Sprint(n-1) {
		t.Fatalf("read %d records, want the newest (fewer than %d, the oldest rotated away), ending with %d", len(all), n, n-1)
	}
	for i := 1; i < len(all); i++ {
		if !all[i].Time.After(all[i-1].Time) {
			t.Fatalf("records out of order at %d: %v after %v", i, all[i].Time, all[i-1].Time)
		}
	}
	got, more, err := l.Read(Filter{Limit: 5, Since: t0.Add(150 * time.Second), Until: t0.Add(190 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if !more || len(got) != 5 || got[0].Target != "185" || got[4].Target != "189" {
		t.Errorf("since 150 until 190 limit 5: %v %+v", more, got)
	}
	if c := testutil.ToFloat64(l.records.WithLabelValues("session.create", OK)); c != n {
		t.Errorf("counter %v, want %d", c, n)
	}
}

// TestReopenAppends: a second Log on the same path appends after the
// first's records (a restarted API), and a torn last line (a crash in
// the middle of a write) is skipped, not fatal.
func TestReopenAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := open(t, Options{Path: path})
	if err := l.Write(Record{Actor: "ada", Action: "quota.put", Outcome: Refused}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"time":"2026-01-0`)
	f.Close()
	l2 := open(t, Options{Path: path})
	if err := l2.Write(Record{Actor: "bob", Action: "session.stop", Outcome: OK}); err != nil {
		t.Fatal(err)
	}
	got, _, err := l2.Read(Filter{})
	if err != nil {
		t.Fatal(err)
	}
	// The torn line and the next record share a line: that line is lost,
	// the first record is not.
	if len(got) < 1 || got[0].Actor != "ada" {
		t.Errorf("read %+v", got)
	}
	if err := l.Write(Record{Action: "x"}); err == nil {
		t.Error("a closed log accepted a write")
	}
}

// TestConcurrentWrites: lines from many goroutines never interleave,
// across rotations.
func TestConcurrentWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := open(t, Options{Path: path, MaxBytes: 8 << 10, Keep: 100})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				if err := l.Write(Record{Actor: fmt.Sprint(g), Action: "session.create", Target: strings.Repeat("x", i), Outcome: OK}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got, _, err := l.Read(Filter{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 800 {
		t.Errorf("read %d records, want 800", len(got))
	}
}

func TestFilterAction(t *testing.T) {
	r := Record{Action: "session.create", Actor: "jupyterhub", OnBehalfOf: "bob"}
	for f, want := range map[Filter]bool{
		{Action: "session."}:       true,
		{Action: "session.create"}: true,
		{Action: "session"}:        false,
		{Action: "quota."}:         false,
		{Actor: "bob"}:             true,
		{Actor: "jupyterhub"}:      true,
		{Actor: "ada"}:             false,
	} {
		if got := f.match(r); got != want {
			t.Errorf("%+v matches %v, want %v", f, got, want)
		}
	}
}
