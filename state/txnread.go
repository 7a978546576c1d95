package state

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// FirstKVs returns, for each of a transaction's responses in order, the
// first key-value it read: the record an OpGet of one key found, or nil
// where there was none (or the response is not a read).
func FirstKVs(resp *clientv3.TxnResponse) []*mvccpb.KeyValue {
	out := make([]*mvccpb.KeyValue, len(resp.Responses))
	for i, r := range resp.Responses {
		if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
			out[i] = kvs[0]
		}
	}
	return out
}

// ModRevision is kv's mod revision, 0 for nil: what a transaction that
// must find a key as it was read compares (0: it must still be absent).
func ModRevision(kv *mvccpb.KeyValue) int64 {
	if kv == nil {
		return 0
	}
	return kv.ModRevision
}

// ReadAtLeast reads, in one transaction, the gets ops builds (each with
// opts, to which it adds its own), from whichever member the client asks
// (serializable: no round to the leader), and returns that answer when the
// member had applied revision atLeast; otherwise, or with atLeast 0, it
// reads linearizably. It serves a writer that acts on a change it saw at
// atLeast: a decision from any state at or after that change is as good
// as one from the latest, as long as the writer's transaction compares
// what it read (a later change refuses it, and the retry reads afresh), and
// as long as what it concludes without writing holds for good once true
// (a binding of that revision gone, an attempt launched, a session ended).
func ReadAtLeast(ctx context.Context, kv clientv3.KV, atLeast int64, ops func(opts ...clientv3.OpOption) []clientv3.Op) (*clientv3.TxnResponse, error) {
	if atLeast > 0 {
		resp, err := kv.Txn(ctx).Then(ops(clientv3.WithSerializable())...).Commit()
		if err == nil && resp.Header.Revision >= atLeast {
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return kv.Txn(ctx).Then(ops()...).Commit()
}
