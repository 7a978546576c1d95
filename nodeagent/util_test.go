package nodeagent_test

import (
	"context"
	"strconv"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

func itoa(n int) string     { return strconv.Itoa(n) }
func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

func clientv3LeaseID(id int64) clientv3.LeaseID { return clientv3.LeaseID(id) }

func bindingOf(t *testing.T, cli *clientv3.Client, id string) state.Binding {
	t.Helper()
	b, _, err := state.Get[state.Binding](context.Background(), cli, keys.Binding(node, id))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
