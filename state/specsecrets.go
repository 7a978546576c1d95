package state

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Directories of the secrets a session's containers need.
const (
	dirSpecSecrets  = "specsecrets"
	dirBoundSecrets = "boundsecrets"
)

// SpecSecretsDir is the prefix of every session's (and job array's)
// secrets: specsecrets/<id>. The API writes a session's with its spec;
// the API and the placers read them (the placer copies them into the
// bind); the agents and the operator's role do not.
func (k Keys) SpecSecretsDir() string { return k.dir(dirSpecSecrets) }

// SpecSecrets is the key of the secrets of session (or array template) id.
func (k Keys) SpecSecrets(id string) string { return k.key(dirSpecSecrets, id) }

// BoundSecretsDir is the prefix of the copies of sessions' secrets that
// binds hand to nodes: boundsecrets/<node>/<id>.
func (k Keys) BoundSecretsDir() string { return k.dir(dirBoundSecrets) }

// NodeBoundSecrets is the prefix of the secrets of the sessions bound to
// node: the one range of them its agent's role reads.
func (k Keys) NodeBoundSecrets(node string) string { return k.key(dirBoundSecrets, node) + "/" }

// BoundSecrets is the key of node's copy of session id's secrets.
func (k Keys) BoundSecrets(node, id string) string { return k.key2(dirBoundSecrets, node, id) }

// BoundSecretsKey splits a key under boundsecrets/ into node and id.
func (k Keys) BoundSecretsKey(key string) (node, id string, ok bool) {
	return k.nodeSession(dirBoundSecrets, key)
}

// SpecSecrets are the values a session's containers need that nobody but
// its owner, the API and the agents of its nodes may read: its
// environment values and a Ray session's token. They are stored at
// specsecrets/<id>, out of the spec (which the operator and every agent
// read), and the bind copies them to boundsecrets/<node>/<id> for each
// node it binds, which that node's agent alone reads.
type SpecSecrets struct {
	Session string `json:"session"`
	// Env are the values of the spec's environment variables that the
	// spec holds empty (Session.SecretEnv).
	Env map[string]string `json:"env,omitempty"`
	// RayToken is a Ray session's authentication token (RAY_AUTH_TOKEN
	// in every part).
	RayToken string `json:"rayToken,omitempty"`
}

// secretEnv reports whether the value of variable name is the user's, to
// be kept out of the spec: every variable but Voyager's own (VOYAGER_*,
// which a request may not set).
func secretEnv(name string) bool { return !strings.HasPrefix(name, "VOYAGER_") }

// SplitSpecSecrets moves s's environment values (all but Voyager's own) out of
// the spec: it returns s with those values empty and SecretEnv set, and
// the secrets; nil secrets and s unchanged when it has none. The caller
// adds the Ray token.
func SplitSpecSecrets(s Session) (Session, *SpecSecrets) {
	var sec *SpecSecrets
	for k, v := range s.Env {
		if !secretEnv(k) {
			continue
		}
		if sec == nil {
			sec = &SpecSecrets{Session: s.ID, Env: map[string]string{}}
			s.Env = maps.Clone(s.Env)
		}
		sec.Env[k] = v
		s.Env[k] = ""
	}
	if sec != nil {
		s.SecretEnv = true
	}
	return s, sec
}

// JoinSpecSecrets returns s with its environment values from sec, for the
// session's owner and its containers. s is not changed.
func JoinSpecSecrets(s Session, sec SpecSecrets) Session {
	if len(sec.Env) == 0 {
		return s
	}
	env := maps.Clone(s.Env)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range sec.Env {
		env[k] = v
	}
	s.Env = env
	return s
}

// NeedsSecrets reports whether a bind of s must hand its nodes secrets:
// it holds environment values out of the spec, or is a Ray gang (whose
// token its parts share).
func NeedsSecrets(s Session) bool {
	return s.SecretEnv || s.Ray != nil && s.Ray.Workers > 0
}

// secretOps splits s's secrets out of its spec (SplitSpecSecrets), gives a Ray
// gang its token, and returns the spec to write and the put of its
// secrets record (none when it has none).
func secretOps(k Keys, s Session) (Session, []clientv3.Op, error) {
	s, sec := SplitSpecSecrets(s)
	if s.Ray != nil && s.Ray.Workers > 0 {
		if sec == nil {
			sec = &SpecSecrets{Session: s.ID}
		}
		var b [24]byte
		if _, err := rand.Read(b[:]); err != nil {
			return s, nil, fmt.Errorf("make Ray token: %w", err)
		}
		sec.RayToken = hex.EncodeToString(b[:])
	}
	if sec == nil {
		return s, nil, nil
	}
	v, err := Encode(sec)
	if err != nil {
		return s, nil, err
	}
	return s, []clientv3.Op{clientv3.OpPut(k.SpecSecrets(s.ID), v)}, nil
}

// SecretsSize is what handing a session's secrets to its bindings adds
// to a bind transaction: one put per binding.
func SecretsSize(bindings int) TxnSize { return TxnSize{Then: bindings} }

// boundSecretOps appends, for each placement that carries secrets, a put
// of them to each of its bindings' nodes (boundsecrets/<node>/<id>).
func boundSecretOps(k Keys, ps []Placement, ops []clientv3.Op) ([]clientv3.Op, error) {
	for i := range ps {
		p := &ps[i]
		if p.Secrets == nil {
			continue
		}
		v, err := Encode(p.Secrets)
		if err != nil {
			return nil, err
		}
		for _, b := range p.Bindings {
			ops = append(ops, clientv3.OpPut(k.BoundSecrets(b.Node, p.Session), v))
		}
	}
	return ops, nil
}
