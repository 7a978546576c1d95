package nodeagent

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// errNoSecrets means this node holds no copy of a session's secrets that
// its spec says it has: its bind did not hand them (a placer from before
// boundsecrets/, or the record was gone when it bound). The session
// cannot start without its environment; it fails with this reason.
var errNoSecrets = errors.New("no copy of the session's secrets on this node")

// boundSecrets reads this node's copy of session id's secrets
// (boundsecrets/<node>/<id>): the only secrets of any session its etcd
// role may read.
func (a *Agent) boundSecrets(ctx context.Context, id string) (state.SpecSecrets, error) {
	key := a.cfg.Keys.BoundSecrets(a.cfg.Node, id)
	sec, _, err := state.Get[state.SpecSecrets](ctx, a.cfg.Client, key)
	if errors.Is(err, state.ErrNotFound) {
		return state.SpecSecrets{}, fmt.Errorf("read secrets of %s (%s): %w", id, key, errNoSecrets)
	}
	if err != nil {
		return state.SpecSecrets{}, fmt.Errorf("read secrets of %s: %w", id, err)
	}
	return sec, nil
}

// readSpec reads, in one round trip, the spec of binding b's session,
// this node's copy of its secrets, and what the binding's launch decides
// from (state.LaunchReads: the binding, this node's part, the status),
// and returns the spec with its environment joined from the secrets, the
// revision read at (the spec is that revision's: a watch of it resumes
// after it), and the launch's reads for state.LaunchFrom; state.ErrNotFound
// when the spec is gone. secretsErr is errNoSecrets (wrapped) when the
// spec says it has secrets and this node holds no copy (the spec is
// returned as it is then).
//
// It reads from any member that holds the binding (bindingRev, its create
// revision; state.ReadAtLeast): what it concludes alone (the spec gone,
// the session stopping, the attempt launched) stays so once true, and the
// launch compares the rest.
func (a *Agent) readSpec(ctx context.Context, b state.Binding, bindingRev int64) (s state.Session, rev int64, launch []*etcdserverpb.ResponseOp, secretsErr, err error) {
	id := b.Session
	sk, bk := a.cfg.Keys.Session(id), a.cfg.Keys.BoundSecrets(a.cfg.Node, id)
	r, err := state.ReadAtLeast(ctx, a.cfg.Client, bindingRev, func(o ...clientv3.OpOption) []clientv3.Op {
		ops := []clientv3.Op{clientv3.OpGet(sk, o...), clientv3.OpGet(bk, o...)}
		for _, op := range state.LaunchReads(a.cfg.Keys, b) {
			ops = append(ops, clientv3.OpGet(string(op.KeyBytes()), o...))
		}
		return ops
	})
	if err != nil {
		return s, 0, nil, nil, fmt.Errorf("read session %s: %w", id, err)
	}
	skvs, bkvs := r.Responses[0].GetResponseRange().Kvs, r.Responses[1].GetResponseRange().Kvs
	launch = r.Responses[2:]
	if len(skvs) == 0 {
		return s, 0, launch, nil, fmt.Errorf("read session %s: %w", id, state.ErrNotFound)
	}
	if s, err = state.Decode[state.Session](skvs[0].Value); err != nil {
		return s, 0, launch, nil, fmt.Errorf("read session %s: %w", id, err)
	}
	rev = r.Header.Revision
	if !s.SecretEnv {
		return s, rev, launch, nil, nil
	}
	if len(bkvs) == 0 {
		return s, rev, launch, fmt.Errorf("read secrets of %s (%s): %w", id, bk, errNoSecrets), nil
	}
	sec, err := state.Decode[state.SpecSecrets](bkvs[0].Value)
	if err != nil {
		return s, 0, launch, nil, fmt.Errorf("read secrets of %s: %w", id, err)
	}
	s = state.JoinSpecSecrets(s, sec)
	s.SecretEnv = false
	return s, rev, launch, nil, nil
}
