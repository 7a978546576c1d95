package state_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestAccrueAllRecordsEachOnceInOneTransaction: three ended attempts (one
// over midnight) are recorded by one transaction, the days summed by
// owner; recorded again, none counts twice; an attempt whose spec or
// status is gone is handed back (missing) unwritten, the others recorded;
// a spec that moved between the read and the write (the accrual's owner,
// team and GPUs come from it) refuses the whole transaction
// (ErrConflict), writing nothing.
func TestAccrueAllRecordsEachOnceInOneTransaction(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys("/t")
	day := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	h := func(x float64) time.Time { return day.Add(time.Duration(x * float64(time.Hour))) }
	put := func(id, owner string, gpus int) {
		t.Helper()
		s := state.Session{ID: id, Owner: owner, Kind: state.KindBatch, Resources: state.Resources{GPUs: gpus}}
		if _, err := state.Put(ctx, cli, k.Session(id), s); err != nil {
			t.Fatal(err)
		}
		if _, err := state.Put(ctx, cli, k.Status(id), state.Status{Session: id, Phase: state.PhaseSucceeded}); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "ada", 2)
	put("b", "bob", 1)
	put("c", "ada", 4)
	ended := []state.Ended{
		{Session: "a", QueueRevision: 10, Bound: h(9), Ended: h(10.5), Rev: 100},
		{Session: "b", QueueRevision: 20, Bound: h(23), Ended: h(25.5), Rev: 101},
		{Session: "c", QueueRevision: 30, Attempt: 1, Bound: h(12), Ended: h(13), Rev: 102},
	}
	before, err := cli.Get(ctx, "/t/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	done, missing, err := state.AccrueAll(ctx, cli, k, ended, &state.UsageCursor{Revision: 101}, h(30))
	if err != nil || len(missing) != 0 || len(done) != 3 || !done[0] || !done[1] || !done[2] {
		t.Fatalf("AccrueAll: done %v, missing %v, err %v", done, missing, err)
	}
	after, err := cli.Get(ctx, "/t/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision+1 {
		t.Errorf("recorded in %d revisions, want 1", after.Header.Revision-before.Header.Revision)
	}
	want := map[string]map[string]int64{
		"2026-11-20": {"/ada": 2*90*60000 + 4*60*60000, "/bob": 60 * 60000},
		"2026-11-21": {"/bob": 90 * 60000},
	}
	wantAttempts := map[string]int{"2026-11-20": 3, "2026-11-21": 1}
	checkDays := func(when string) {
		t.Helper()
		for d, subjects := range want {
			u, _, err := state.Get[state.UsageDay](ctx, cli, k.GPUHoursDir()+d)
			if err != nil {
				t.Fatalf("%s: day %s: %v", when, d, err)
			}
			if len(u.GPUMilliseconds) != len(subjects) || u.Attempts != wantAttempts[d] {
				t.Errorf("%s: day %s holds %v from %d attempts, want %v from %d", when, d, u.GPUMilliseconds, u.Attempts, subjects, wantAttempts[d])
			}
			for s, ms := range subjects {
				if u.GPUMilliseconds[s] != ms {
					t.Errorf("%s: day %s %s = %d ms, want %d", when, d, s, u.GPUMilliseconds[s], ms)
				}
			}
		}
	}
	checkDays("first")
	a, _, err := state.Get[state.Accrual](ctx, cli, k.Accrual("c", 30))
	if err != nil || a.Owner != "ada" || a.GPUs != 4 || a.Attempt != 1 || a.GPUMilliseconds != 4*3600000 || !a.Bound.Equal(h(12)) || !a.Ended.Equal(h(13)) {
		t.Errorf("c's accrual %+v, %v", a, err)
	}
	cur, _, err := state.Get[state.UsageCursor](ctx, cli, k.UsageCursor())
	if err != nil || cur.Revision != 101 {
		t.Errorf("cursor %+v, %v; want revision 101", cur, err)
	}

	// Again: counted before, nothing written.
	done, missing, err = state.AccrueAll(ctx, cli, k, ended, nil, h(31))
	if err != nil || len(missing) != 0 || done[0] || done[1] || done[2] {
		t.Fatalf("again: done %v, missing %v, err %v", done, missing, err)
	}
	checkDays("again")

	// A retired spec: handed back, not written.
	if _, err := cli.Delete(ctx, k.Session("b")); err != nil {
		t.Fatal(err)
	}
	put("d", "dan", 1)
	if _, err := cli.Delete(ctx, k.Session("b")); err != nil {
		t.Fatal(err)
	}
	more := []state.Ended{{Session: "b", QueueRevision: 21, Bound: h(26), Ended: h(27), Rev: 200},
		{Session: "d", QueueRevision: 40, Bound: h(2), Ended: h(3), Rev: 201}}
	done, missing, err = state.AccrueAll(ctx, cli, k, more, nil, h(32))
	if err != nil || len(missing) != 1 || missing[0] != 0 || done[0] || !done[1] {
		t.Fatalf("a retired spec: done %v, missing %v, err %v", done, missing, err)
	}
	want["2026-11-20"]["/dan"] = 60 * 60000
	wantAttempts["2026-11-20"]++
	checkDays("a retired spec")

	// A retired status: handed back too.
	put("e", "eve", 1)
	put("f", "fay", 1)
	if _, err := cli.Delete(ctx, k.Status("f")); err != nil {
		t.Fatal(err)
	}
	last := []state.Ended{{Session: "e", QueueRevision: 50, Bound: h(4), Ended: h(5), Rev: 300},
		{Session: "f", QueueRevision: 60, Bound: h(4), Ended: h(5), Rev: 301}}
	done, missing, err = state.AccrueAll(ctx, cli, k, last, nil, h(33))
	if err != nil || len(missing) != 1 || missing[0] != 1 || !done[0] || done[1] {
		t.Fatalf("a retired status: done %v, missing %v, err %v", done, missing, err)
	}
	want["2026-11-20"]["/eve"] = 60 * 60000
	wantAttempts["2026-11-20"]++
	checkDays("a retired status")

	// A spec that moved between the read and the write refuses the whole
	// transaction (ErrConflict), writing nothing.
	put("g", "gus", 1)
	put("i", "ivy", 1)
	moved := []state.Ended{{Session: "g", QueueRevision: 70, Bound: h(6), Ended: h(7), Rev: 400},
		{Session: "i", QueueRevision: 80, Bound: h(6), Ended: h(7), Rev: 401}}
	mover := &movingKV{KV: cli, move: func() {
		if _, err := state.Put(ctx, cli, k.Session("i"), state.Session{ID: "i", Owner: "ivy", Kind: state.KindBatch, Resources: state.Resources{GPUs: 2}}); err != nil {
			t.Error(err)
		}
	}}
	if _, _, err := state.AccrueAll(ctx, mover, k, moved, nil, h(34)); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("a spec that moved: %v, want ErrConflict", err)
	}
	if r, err := cli.Get(ctx, k.Accrual("g", 70)); err != nil || len(r.Kvs) != 0 {
		t.Errorf("g's accrual written by a refused transaction: %v, %v", r, err)
	}
	checkDays("a spec that moved")
}

// movingKV runs move once, as the first transaction with compares (the
// write, after its reads) is built.
type movingKV struct {
	clientv3.KV
	move  func()
	moved bool
}

func (m *movingKV) Txn(ctx context.Context) clientv3.Txn {
	return &movingTxn{Txn: m.KV.Txn(ctx), kv: m}
}

type movingTxn struct {
	clientv3.Txn
	kv *movingKV
}

func (t *movingTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	if !t.kv.moved {
		t.kv.moved = true
		t.kv.move()
	}
	return t.Txn.If(cs...)
}
