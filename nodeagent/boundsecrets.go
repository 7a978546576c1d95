package nodeagent

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
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

// readSpec reads session id's spec, this node's copy of its secrets and
// this node's part of it (parts/<node>/<id>, nil when there is none) in
// one round trip, and returns the spec with its environment joined from
// them, and the revision read at (the spec is that revision's: a watch
// of it resumes after it); state.ErrNotFound when the spec is gone.
// secretsErr is errNoSecrets (wrapped) when the spec says it has secrets
// and this node holds no copy (the spec is returned as it is then).
func (a *Agent) readSpec(ctx context.Context, id string) (s state.Session, rev int64, part *mvccpb.KeyValue, secretsErr, err error) {
	sk, bk := a.cfg.Keys.Session(id), a.cfg.Keys.BoundSecrets(a.cfg.Node, id)
	r, err := a.cfg.Client.Txn(ctx).Then(clientv3.OpGet(sk), clientv3.OpGet(bk), clientv3.OpGet(a.cfg.Keys.Part(a.cfg.Node, id))).Commit()
	if err != nil {
		return s, 0, nil, nil, fmt.Errorf("read session %s: %w", id, err)
	}
	skvs, bkvs := r.Responses[0].GetResponseRange().Kvs, r.Responses[1].GetResponseRange().Kvs
	if pkvs := r.Responses[2].GetResponseRange().Kvs; len(pkvs) > 0 {
		part = pkvs[0]
	}
	if len(skvs) == 0 {
		return s, 0, part, nil, fmt.Errorf("read session %s: %w", id, state.ErrNotFound)
	}
	if s, err = state.Decode[state.Session](skvs[0].Value); err != nil {
		return s, 0, part, nil, fmt.Errorf("read session %s: %w", id, err)
	}
	rev = r.Header.Revision
	if !s.SecretEnv {
		return s, rev, part, nil, nil
	}
	if len(bkvs) == 0 {
		return s, rev, part, fmt.Errorf("read secrets of %s (%s): %w", id, bk, errNoSecrets), nil
	}
	sec, err := state.Decode[state.SpecSecrets](bkvs[0].Value)
	if err != nil {
		return s, 0, part, nil, fmt.Errorf("read secrets of %s: %w", id, err)
	}
	s = state.JoinSpecSecrets(s, sec)
	s.SecretEnv = false
	return s, rev, part, nil, nil
}
