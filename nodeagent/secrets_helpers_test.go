package nodeagent_test

import (
	"context"
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// specSecretsOf reads session id's secrets record, as a placer does to
// hand them to the nodes it binds (nil: none).
func specSecretsOf(t testing.TB, cli *clientv3.Client, id string) *state.SpecSecrets {
	t.Helper()
	sec, _, err := state.Get[state.SpecSecrets](context.Background(), cli, keys.SpecSecrets(id))
	if errors.Is(err, state.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &sec
}
