package state

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultPrefix is the key prefix used when none is configured.
const DefaultPrefix = "/voyager"

// Key directories under the prefix. Each names one kind of record; see
// docs/state.md for the value shapes.
const (
	dirSessions = "sessions"
	dirPending  = "pending"
	dirStatus   = "status"
	dirNodes    = "nodes"
	dirLedger   = "ledger"
	dirBindings = "bindings"
	dirCordons  = "cordons"
	dirQuotas   = "quotas"
	dirProfiles = "profiles"
	dirPlacers  = "placers"
	dirIdem     = "idempotency"
	dirWarnings = "warnings"
	dirSecrets  = "secrets"
	dirElection = "elections"
	dirUIDs     = "uids"
	dirParts    = "parts"
	dirRay      = "raytokens"
)

// Keys builds every etcd key under one prefix. The zero value is not usable;
// build one with NewKeys.
type Keys struct {
	prefix string // without trailing slash, e.g. "/voyager"
}

var prefixRE = regexp.MustCompile(`^(/[A-Za-z0-9._-]+)+$`)

// NewKeys validates prefix and returns the key builder for it. A prefix is
// one or more "/segment" parts of letters, digits, '.', '_' or '-', with no
// trailing slash, for example "/voyager" or "/lab/voyager".
func NewKeys(prefix string) (Keys, error) {
	if !prefixRE.MatchString(prefix) {
		return Keys{}, fmt.Errorf("parse key prefix %q: want one or more /segments of letters, digits, '.', '_' or '-' with no trailing slash, for example %q", prefix, DefaultPrefix)
	}
	return Keys{prefix: prefix}, nil
}

// MustKeys is NewKeys for prefixes known to be valid (constants, tests).
func MustKeys(prefix string) Keys {
	k, err := NewKeys(prefix)
	if err != nil {
		panic(err)
	}
	return k
}

// Prefix returns the prefix without a trailing slash.
func (k Keys) Prefix() string { return k.prefix }

// All is the prefix of every Voyager key, with a trailing slash.
func (k Keys) All() string { return k.prefix + "/" }

func (k Keys) dir(d string) string            { return k.prefix + "/" + d + "/" }
func (k Keys) key(d, name string) string      { return k.prefix + "/" + d + "/" + name }
func (k Keys) key2(d, a, b string) string     { return k.prefix + "/" + d + "/" + a + "/" + b }
func (k Keys) trimDir(d, key string) string   { return key[len(k.prefix)+len(d)+2:] }
func (k Keys) splitIn(d, key string) []string { return strings.Split(k.trimDir(d, key), "/") }

// hasDir reports whether key is under k.dir(d), without building that
// string: a queue snapshot from a plainly decoded cache (the API's) asks
// it of every queued key.
func (k Keys) hasDir(d, key string) bool {
	rest, ok := strings.CutPrefix(key, k.prefix)
	if !ok || len(rest) < len(d)+2 || rest[0] != '/' {
		return false
	}
	return rest[1:1+len(d)] == d && rest[1+len(d)] == '/'
}

// Sessions is the prefix of session specs.
func (k Keys) Sessions() string { return k.dir(dirSessions) }

// Session is the key of session id's spec.
func (k Keys) Session(id string) string { return k.key(dirSessions, id) }

// PendingDir is the prefix of queue entries.
func (k Keys) PendingDir() string { return k.dir(dirPending) }

// Pending is the key of session id's queue entry.
func (k Keys) Pending(id string) string { return k.key(dirPending, id) }

// StatusDir is the prefix of session statuses.
func (k Keys) StatusDir() string { return k.dir(dirStatus) }

// Status is the key of session id's status.
func (k Keys) Status(id string) string { return k.key(dirStatus, id) }

// Nodes is the prefix of node inventories.
func (k Keys) Nodes() string { return k.dir(dirNodes) }

// Node is the key of node name's inventory; it is attached to the agent's lease.
func (k Keys) Node(name string) string { return k.key(dirNodes, name) }

// Ledgers is the prefix of node ledgers.
func (k Keys) Ledgers() string { return k.dir(dirLedger) }

// Ledger is the key of node name's ledger.
func (k Keys) Ledger(name string) string { return k.key(dirLedger, name) }

// AllBindings is the prefix of every binding of every node.
func (k Keys) AllBindings() string { return k.dir(dirBindings) }

// Bindings is the prefix of the bindings of one node: what its agent watches.
func (k Keys) Bindings(node string) string { return k.key(dirBindings, node) + "/" }

// Binding is the key telling node to run its part of session id.
func (k Keys) Binding(node, id string) string { return k.key2(dirBindings, node, id) }

// Cordons is the prefix of cordon records.
func (k Keys) Cordons() string { return k.dir(dirCordons) }

// Cordon is the key whose presence cordons node name.
func (k Keys) Cordon(name string) string { return k.key(dirCordons, name) }

// Quotas is the prefix of every quota.
func (k Keys) Quotas() string { return k.dir(dirQuotas) }

// UserQuota is the key of user name's quota.
func (k Keys) UserQuota(name string) string { return k.key2(dirQuotas, "users", name) }

// GroupQuota is the key of group name's quota.
func (k Keys) GroupQuota(name string) string { return k.key2(dirQuotas, "groups", name) }

// Profiles is the prefix of session profiles.
func (k Keys) Profiles() string { return k.dir(dirProfiles) }

// Profile is the key of profile name.
func (k Keys) Profile(name string) string { return k.key(dirProfiles, name) }

// Placers is the prefix of live placer records.
func (k Keys) Placers() string { return k.dir(dirPlacers) }

// Placer is the key of placer id's record; it is attached to its lease.
func (k Keys) Placer(id string) string { return k.key(dirPlacers, id) }

// IdempotencyDir is the prefix of idempotency records.
func (k Keys) IdempotencyDir() string { return k.dir(dirIdem) }

// Idempotency is the key of the record of one Idempotency-Key of owner;
// digest is a hex digest of the client's key, so any header value is safe.
func (k Keys) Idempotency(owner, digest string) string { return k.key2(dirIdem, owner, digest) }

// Warnings is the directory of lifecycle warnings.
func (k Keys) Warnings() string { return k.dir(dirWarnings) }

// Warning is the key of session id's lifecycle warning.
func (k Keys) Warning(id string) string { return k.key(dirWarnings, id) }

// SecretsDir is the prefix of every session secret. Only the API reads it
// all; each agent reads and writes its own node's part (NodeSecrets); the
// operator's etcd role does not read it (docs/deployment.md).
func (k Keys) SecretsDir() string { return k.dir(dirSecrets) }

// NodeSecrets is the prefix of the secrets of the sessions on node.
func (k Keys) NodeSecrets(node string) string { return k.key(dirSecrets, node) + "/" }

// Secret is the key of the secrets of session id's part on node: the
// URLs that carry a token or a key.
func (k Keys) Secret(node, id string) string { return k.key2(dirSecrets, node, id) }

// RayTokens is the prefix of the Ray sessions' authentication tokens
// (raytokens/<id>): the API writes one with the session, every agent
// reads them (a Ray gang's parts run on nodes no prefix can name), the
// placer's retention deletes them; the operator's role does not read them.
func (k Keys) RayTokens() string { return k.dir(dirRay) }

// RayToken is the key of session id's Ray token.
func (k Keys) RayToken(id string) string { return k.key(dirRay, id) }

// Elections is the prefix of the placers' elections (etcd's election
// recipe under it: elections/<name>/<lease>).
func (k Keys) Elections() string { return k.dir(dirElection) }

// UIDs is the prefix of the owners' container user ids (uids/owners/<owner>
// and uids/numbers/<uid>; see EnsureUID).
func (k Keys) UIDs() string { return k.dir(dirUIDs) }

// Parts is the prefix of every part status of every node: what the
// placers' status mergers watch.
func (k Keys) Parts() string { return k.dir(dirParts) }

// NodeParts is the prefix of the part statuses node's agent writes: the
// only range of parts/ its etcd role may write.
func (k Keys) NodeParts(node string) string { return k.key(dirParts, node) + "/" }

// Part is the key of what node's agent observed of its part of session id.
func (k Keys) Part(node, id string) string { return k.key2(dirParts, node, id) }

// PartKey splits a key under parts/ into node and session id.
func (k Keys) PartKey(key string) (node, id string, ok bool) { return k.nodeSession(dirParts, key) }

// SessionID returns the session id of a key under sessions/, pending/,
// status/ or warnings/, and false for any other key.
func (k Keys) SessionID(key string) (string, bool) {
	for _, d := range []string{dirSessions, dirPending, dirStatus, dirWarnings} {
		if k.hasDir(d, key) {
			id := k.trimDir(d, key)
			return id, id != "" && !strings.Contains(id, "/")
		}
	}
	return "", false
}

// NodeName returns the node name of a key under nodes/, ledger/ or cordons/,
// and false for any other key.
func (k Keys) NodeName(key string) (string, bool) {
	for _, d := range []string{dirNodes, dirLedger, dirCordons} {
		if k.hasDir(d, key) {
			n := k.trimDir(d, key)
			return n, n != "" && !strings.Contains(n, "/")
		}
	}
	return "", false
}

// BindingKey splits a key under bindings/ into node and session id.
func (k Keys) BindingKey(key string) (node, id string, ok bool) {
	return k.nodeSession(dirBindings, key)
}

// nodeSession splits a key <dir>/<node>/<id> into node and session id.
func (k Keys) nodeSession(dir, key string) (node, id string, ok bool) {
	if !k.hasDir(dir, key) {
		return "", "", false
	}
	parts := k.splitIn(dir, key)
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// QuotaKey splits a key under quotas/ into its scope and subject name.
func (k Keys) QuotaKey(key string) (scope QuotaScope, name string, ok bool) {
	if !k.hasDir(dirQuotas, key) {
		return "", "", false
	}
	parts := k.splitIn(dirQuotas, key)
	if len(parts) != 2 || parts[1] == "" {
		return "", "", false
	}
	switch QuotaScope(parts[0]) {
	case QuotaUsers, QuotaGroups:
		return QuotaScope(parts[0]), parts[1], true
	}
	return "", "", false
}

// ProfileName returns the profile name of a key under profiles/.
func (k Keys) ProfileName(key string) (string, bool) {
	if !k.hasDir(dirProfiles, key) {
		return "", false
	}
	n := k.trimDir(dirProfiles, key)
	return n, n != "" && !strings.Contains(n, "/")
}

var subjectRE = regexp.MustCompile(`^[A-Za-z0-9@._+-]{1,128}$`)

// ValidateSubject checks a user or group name as it appears in JWT claims
// and in quota keys: 1 to 128 letters, digits, '@', '.', '_', '+' or '-'.
func ValidateSubject(what, s string) error {
	if !subjectRE.MatchString(s) {
		return fmt.Errorf("invalid %s %q: want 1-128 letters, digits, '@', '.', '_', '+' or '-'", what, s)
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// ValidateName checks that s can be one segment of a key: 1 to 63 lower-case
// letters, digits, '.', '_' or '-', starting and ending with a letter or
// digit. what names the thing for the error ("node name", "session id").
func ValidateName(what, s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("invalid %s %q: want 1-63 lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit", what, s)
	}
	return nil
}
