package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// pruneSecrets deletes this node's session secrets (secrets/<node>/<id>)
// whose session has no status any more: retention retired it. A secret
// outlives its containers on purpose, since its log URL serves the log of a
// finished job; it goes with the session's record. Each delete compares
// that the status is absent, so a session re-created in between keeps its
// secret. It returns how many it deleted.
func (a *Agent) pruneSecrets(ctx context.Context) (int, error) {
	cli, k := a.cfg.Client, a.cfg.Keys
	prefix := k.NodeSecrets(a.cfg.Node)
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("list session secrets: %w", err)
	}
	removed := 0
	var errs []error
	for _, kv := range resp.Kvs {
		id := strings.TrimPrefix(string(kv.Key), prefix)
		r, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k.Status(id)), "=", 0)).
			Then(clientv3.OpDelete(string(kv.Key))).Commit()
		if err != nil {
			errs = append(errs, fmt.Errorf("delete secrets of %s: %w", id, err))
			continue
		}
		if r.Succeeded {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}
