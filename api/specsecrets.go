package api

import (
	"context"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// withEnvSecrets returns v with its environment values joined back from
// the session's secrets record (specsecrets/<id>), for its owner: from
// the cache, else read from etcd (a session created through another API
// that this one's cache has not caught up with). A spec without
// SecretEnv holds its values itself.
func (a *API) withEnvSecrets(v SessionView) SessionView {
	if !v.SecretEnv {
		return v
	}
	key := a.keys.SpecSecrets(v.ID)
	sec, ok := a.envs.Get(key)
	if !ok {
		ctx, cancel := context.WithTimeout(a.streams, 2*time.Second)
		var err error
		sec, _, err = state.Get[state.SpecSecrets](ctx, a.cli, key)
		cancel()
		if err != nil {
			return v
		}
	}
	v.Session = state.JoinSpecSecrets(v.Session, sec)
	v.SecretEnv = false
	return v
}
