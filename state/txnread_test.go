package state

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestFirstKVs: one entry per response, in order: the first key-value of
// a read that found some, nil for a read that found none and for a write.
func TestFirstKVs(t *testing.T) {
	a, b := &mvccpb.KeyValue{Key: []byte("a"), ModRevision: 7}, &mvccpb.KeyValue{Key: []byte("b"), ModRevision: 9}
	read := func(kvs ...*mvccpb.KeyValue) *pb.ResponseOp {
		return &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Kvs: kvs}}}
	}
	resp := &clientv3.TxnResponse{Responses: []*pb.ResponseOp{
		read(a, b), read(), {Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{}}}, read(b),
	}}
	got := FirstKVs(resp)
	want := []*mvccpb.KeyValue{a, nil, nil, b}
	if len(got) != len(want) {
		t.Fatalf("FirstKVs gave %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %v, want %v", i, got[i], want[i])
		}
	}
	if ModRevision(got[0]) != 7 || ModRevision(got[1]) != 0 {
		t.Errorf("ModRevision = %d, %d; want 7 and 0 for none", ModRevision(got[0]), ModRevision(got[1]))
	}
}
