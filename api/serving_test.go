package api_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// behindKV answers serializable read-only transactions as an etcd member
// that has applied nothing after revision at would (each read made at at,
// the header saying at); every other request goes to etcd as it is. It
// stands in for a member of a larger cluster that lags the leader, which
// one test etcd cannot be.
type behindKV struct {
	clientv3.KV
	at atomic.Int64 // 0: not behind
}

func (b *behindKV) Txn(ctx context.Context) clientv3.Txn {
	return &behindTxn{kv: b, ctx: ctx}
}

// behindTxn records a transaction and sends it at Commit.
type behindTxn struct {
	kv         *behindKV
	ctx        context.Context
	cmps       []clientv3.Cmp
	then, els  []clientv3.Op
	serialized bool
}

func (t *behindTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.cmps = cs; return t }

func (t *behindTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = ops
	t.serialized = len(ops) > 0
	for _, op := range ops {
		t.serialized = t.serialized && op.IsGet() && op.IsSerializable() && len(op.RangeBytes()) == 0
	}
	return t
}

func (t *behindTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.els = ops; return t }

func (t *behindTxn) Commit() (*clientv3.TxnResponse, error) {
	at := t.kv.at.Load()
	if at == 0 || !t.serialized || len(t.cmps) > 0 {
		return t.kv.KV.Txn(t.ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
	}
	ops := make([]clientv3.Op, len(t.then))
	for i, op := range t.then {
		ops[i] = clientv3.OpGet(string(op.KeyBytes()), clientv3.WithRev(at), clientv3.WithSerializable())
	}
	resp, err := t.kv.KV.Txn(t.ctx).Then(ops...).Commit()
	if err == nil {
		resp.Header.Revision = at
	}
	return resp, err
}

// TestGetReadsAgainFromABehindMember attacks GET /sessions/{id}'s
// serializable read with an etcd member that lags: a session created
// after the member's revision must not be reported missing, and a status
// that the API's watches have seen change must not be served as it was.
// Each case first shows that the member really answers stale.
func TestGetReadsAgainFromABehindMember(t *testing.T) {
	cli := etcdtest.New(t)
	kv := &behindKV{KV: cli.KV}
	cli.KV = kv
	h := startHarness(t, cli, harnessOpts{})
	ctx := context.Background()
	ada := h.token("ada")
	rereads := func() string {
		for _, l := range strings.Split(gather(t, h.api), "\n") {
			if strings.HasPrefix(l, "voyager_api_session_rereads_total ") {
				return strings.TrimPrefix(l, "voyager_api_session_rereads_total ")
			}
		}
		t.Fatal("no voyager_api_session_rereads_total")
		return ""
	}
	staleRead := func(key string) []byte {
		resp, err := cli.Txn(ctx).Then(clientv3.OpGet(key, clientv3.WithSerializable())).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			return kvs[0].Value
		}
		return nil
	}

	before, err := cli.Get(ctx, "/before")
	if err != nil {
		t.Fatal(err)
	}
	id := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated)).ID

	// A member in step: the GET is served by the serializable read alone.
	want(t, h.do("GET", "/api/v1/sessions/"+id, ada, nil), http.StatusOK)
	if n := rereads(); n != "0" {
		t.Fatalf("%s GETs read again with no member behind", n)
	}

	// A member that has not applied the create.
	kv.at.Store(before.Header.Revision)
	if v := staleRead(h.keys.Session(id)); v != nil {
		t.Fatal("the member behind shows the session: the case tests nothing")
	}
	want(t, h.do("GET", "/api/v1/sessions/"+id, ada, nil), http.StatusOK)
	if n := rereads(); n != "1" {
		t.Fatalf("rereads %s after a GET from a member without the session, want 1", n)
	}

	// A member that has the session but not its newest status, which the
	// API's status cache has seen.
	kv.at.Store(0)
	started := time.Now().UTC()
	h.putStatus(state.Status{Session: id, Phase: state.PhasePending, Reason: "Capacity"})
	pending, err := cli.Get(ctx, "/pending-status")
	if err != nil {
		t.Fatal(err)
	}
	h.putStatus(state.Status{Session: id, Phase: state.PhaseRunning, Nodes: []string{"n1"}, Started: &started})
	h.waitFor("the API's status cache to show Running", func() bool {
		return strings.Contains(gather(t, h.api), `voyager_sessions{phase="Running"} 1`)
	})
	kv.at.Store(pending.Header.Revision)
	if v := staleRead(h.keys.Status(id)); !strings.Contains(string(v), `"Pending"`) {
		t.Fatalf("the member behind shows status %s, want the Pending one: the case tests nothing", v)
	}
	got := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+id, ada, nil), http.StatusOK))
	if got.Status.Phase != state.PhaseRunning {
		t.Fatalf("GET from a member behind the API's watches shows %s, want Running", got.Status.Phase)
	}
	if n := rereads(); n != "2" {
		t.Fatalf("rereads %s, want 2", n)
	}
}
