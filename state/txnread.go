package state

import (
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
