package nodeagent

import (
	"context"
	"errors"
	"fmt"

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

// withSecrets returns s with its environment values joined from this
// node's copy of its secrets, for a spec that holds them empty
// (SecretEnv). It returns errNoSecrets (wrapped) when there is no copy.
func (a *Agent) withSecrets(ctx context.Context, s state.Session) (state.Session, error) {
	if !s.SecretEnv {
		return s, nil
	}
	sec, err := a.boundSecrets(ctx, s.ID)
	if err != nil {
		return s, err
	}
	s = state.JoinSpecSecrets(s, sec)
	s.SecretEnv = false
	return s, nil
}
