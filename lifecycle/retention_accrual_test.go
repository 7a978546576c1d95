package lifecycle

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestRetentionWaitsForTheAccountant: the usage accountant is paused (it
// has a cursor, then stops) while sessions run, back off, run again and
// finish, and retention runs with a retention of a millisecond. Retention
// keeps every finished session whose last attempt is not accrued yet, so
// when the accountant comes back it counts every attempt, once, and none
// late; then retention takes them all. One session finished longer ago
// than the retention plus AccrualWait leaves without its accrual (the
// bound for a stopped accountant): counted as unaccounted, and the history
// checker flags that retirement (rule retired-unaccrued) and no other.
func TestRetentionWaitsForTheAccountant(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	d := usageDriver{t: t, cli: cli}
	start, err := cli.Get(ctx, "voyager-test-start")
	if err != nil {
		t.Fatal(err)
	}

	// The accountant leads once (its cursor is written when it stops),
	// then lags: it does not run while the attempts end.
	acc, stop := runAccountant(t, cli)
	waitUntil(t, "the accountant to lead", func() bool { return acc.Applied() > 0 })
	stop()

	now := time.Now().UTC()
	const n = 12
	attempts := 0
	for i := range n {
		id := fmt.Sprintf("s-%02d", i)
		began := now.Add(-time.Duration(40+i) * time.Minute)
		d.create(id, "ada", "vision", 1+i%2, began)
		qr := int64(1000 + 10*i)
		st := d.run(id, 0, qr, began)
		attempts++
		if i%3 == 0 { // backs off and runs again: two attempts
			retry := began.Add(5 * time.Minute)
			st.Phase, st.Reason, st.RetryAt, st.Updated = state.PhasePending, state.ReasonBackOff, &retry, began.Add(4*time.Minute)
			d.status(st)
			d.status(state.Status{Session: id, Phase: state.PhasePending, Reason: "Queued", Attempt: 1, Updated: retry})
			st = d.run(id, 1, qr+5, retry)
			attempts++
		}
		d.finish(st, now.Add(-time.Duration(i)*time.Minute))
	}
	// Finished three hours ago, past the retention and AccrualWait: it
	// leaves without waiting for the accountant.
	old := now.Add(-4 * time.Hour)
	d.create("s-old", "bob", "", 2, old)
	d.finish(d.run("s-old", 0, 5000, old), old.Add(time.Hour))

	path := filepath.Join(t.TempDir(), "history", "sessions.jsonl")
	ret, err := NewRetention(cli, RetentionConfig{Keys: keys, After: time.Millisecond, AccrualWait: time.Hour, Every: 20 * time.Millisecond,
		HistoryPath: path, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ret.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitUntil(t, "retention to keep the unaccounted sessions", func() bool { return ret.AwaitingAccrual() == n && ret.Retired() == 1 })
	statuses := func() int64 {
		resp, err := cli.Get(ctx, keys.StatusDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	if got := statuses(); got != n {
		t.Errorf("%d statuses left while the accountant lags, want %d", got, n)
	}
	if ret.UnaccountedRetired() != 1 {
		t.Errorf("UnaccountedRetired = %d, want 1 (s-old)", ret.UnaccountedRetired())
	}

	// The accountant comes back: every attempt is accrued once, then
	// retention takes every session.
	acc2, _ := runAccountant(t, cli)
	waitUntil(t, "retention to take every session", func() bool { return statuses() == 0 })
	// Every ended attempt is seen: counted, or late when its session left
	// first (s-old; without the wait, all of them).
	waitUntil(t, "the accountant to see every ended attempt", func() bool { return acc2.Accrued()+acc2.Late() == int64(attempts)+1 })
	// s-old's end is late: its session left before it was seen.
	if acc2.Accrued() != int64(attempts) || acc2.Late() != 1 {
		t.Errorf("the accountant recorded %d attempts and %d late, want %d and 1 (s-old)", acc2.Accrued(), acc2.Late(), attempts)
	}
	got := 0
	for key, a := range d.accruals() {
		if a.Session == "s-old" {
			t.Errorf("s-old accrued after it was retired: %s", key)
		}
		got++
	}
	if got != attempts {
		t.Errorf("%d accruals, want %d", got, attempts)
	}
	if h := readHistory(t, path); len(h) != n+1 {
		t.Errorf("history holds %d sessions, want %d", len(h), n+1)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ret.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		values[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	if values["voyager_retention_sessions_retired_total"] != n+1 || values["voyager_retention_sessions_unaccounted_total"] != 1 ||
		values["voyager_retention_sessions_awaiting_accrual"] != 0 {
		t.Errorf("retention metrics %v", values)
	}

	// The history checker sees the one retirement without an accrual.
	end, err := cli.Get(ctx, "voyager-test-end")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	res, err := history.Watch(wctx, cli, keys, history.Options{Start: start.Header.Revision, End: end.Header.Revision, Keep: 100000})
	if err != nil {
		t.Fatal(err)
	}
	var flagged []history.Violation
	for _, v := range res.Violations {
		if v.Rule == history.RuleRetiredUnaccrued {
			flagged = append(flagged, v)
		}
	}
	if len(flagged) != 1 || flagged[0].Key != keys.Status("s-old") {
		t.Errorf("retired-unaccrued violations %v, want one, s-old's", flagged)
	}
}
