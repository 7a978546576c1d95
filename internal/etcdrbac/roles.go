package etcdrbac

import (
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/authpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// Users and roles. Each role has one user of the same name.
const (
	// API is the role of `voyager api`.
	API = "voyager-api"
	// Placer is the role of `voyager placer` (with its lifecycle
	// controller and retention).
	Placer = "voyager-placer"
	// Operator reads everything but the secrets (secrets/, specsecrets/,
	// boundsecrets/, raytokens/): for etcdctl inspection. Specs hold
	// their environment values empty (state.SpecSecrets).
	Operator = "voyager-operator"
	// agentPrefix + node name is the role of that node's agent.
	agentPrefix = "voyager-agent-"
	// Root is etcd's own administrator; Setup needs it to turn
	// authentication on.
	Root = "root"
)

// Agent is the role (and user) of node's agent.
func Agent(node string) string { return agentPrefix + node }

// Perm is one key range a role may read, write or both.
type Perm struct {
	// Key is the first key; with End empty, the only key.
	Key string
	// End is the range's end (exclusive): for a prefix, the prefix's
	// successor (clientv3.GetPrefixRangeEnd).
	End string
	// Type is read, write or readwrite (clientv3.PermRead, …).
	Type authpb.Permission_Type
}

// String is "read /voyager/nodes/*" or "readwrite /voyager/ledger/gpu-1".
func (p Perm) String() string {
	k := p.Key
	if p.End != "" {
		if p.End == clientv3.GetPrefixRangeEnd(p.Key) {
			k += "*"
		} else {
			k += " .. " + p.End
		}
	}
	return strings.ToLower(p.Type.String()) + " " + k
}

// Role is a role and the ranges it is granted.
type Role struct {
	Name  string
	Perms []Perm
}

func prefix(t authpb.Permission_Type, p string) Perm {
	return Perm{Key: p, End: clientv3.GetPrefixRangeEnd(p), Type: t}
}

func exact(t authpb.Permission_Type, key string) Perm { return Perm{Key: key, Type: t} }

// Roles returns the role table for keys k and the named nodes (one agent
// role each), in a stable order.
//
// Every role reads the bare prefix key (it holds nothing): the processes'
// connection and readiness checks read it.
func Roles(k state.Keys, nodes []string) []Role {
	const (
		r  = clientv3.PermRead
		rw = clientv3.PermReadWrite
	)
	probe := exact(r, k.Prefix())
	roles := []Role{
		{Name: API, Perms: []Perm{
			probe,
			// Create and stop sessions (spec, queue entry, first status),
			// extend limits; admin settings; idempotency records.
			prefix(rw, k.Sessions()), prefix(rw, k.PendingDir()), prefix(rw, k.StatusDir()),
			prefix(rw, k.Cordons()), prefix(rw, k.Quotas()), prefix(rw, k.Profiles()),
			prefix(rw, k.IdempotencyDir()),
			// Each owner's container user id, made at their first create;
			// a session's secrets (its environment values, a Ray token),
			// made with it and joined into its owner's view.
			prefix(rw, k.UIDs()), prefix(rw, k.SpecSecretsDir()),
			// Volume definitions: admins write them; a create resolves a
			// session's volumes into its spec, so no agent reads them.
			prefix(rw, k.Volumes()),
			// Job arrays: create, stop, summaries.
			prefix(rw, k.Arrays()),
			// Teams: admins write them; creates read a session's team;
			// usage reports and budgets read the GPU-hours.
			prefix(rw, k.Teams()), prefix(r, k.GPUHoursDir()),
			// The owners' run times, which the queue view plans with as
			// the placers do.
			prefix(r, k.RuntimesDir()),
			// Its HTTPS endpoint's record, which agents deny sessions.
			prefix(rw, k.ControlPlaneKind(state.EndpointAPI)),
			// Views, the queue plan, events; the owner's URLs.
			prefix(r, k.Nodes()), prefix(r, k.Ledgers()), prefix(r, k.Warnings()), prefix(r, k.EmptiedDir()),
			prefix(r, k.SecretsDir()),
		}},
		{Name: Placer, Perms: []Perm{
			probe,
			// Bind (ledgers, bindings, queue, status), node loss, re-queue,
			// lifecycle evictions and warnings, retention, membership and
			// elections; the status merger (reads the agents' parts,
			// writes statuses, deletes parts done with).
			prefix(rw, k.Sessions()), prefix(rw, k.PendingDir()), prefix(rw, k.StatusDir()),
			prefix(rw, k.Parts()),
			prefix(rw, k.Warnings()), prefix(rw, k.Ledgers()), prefix(rw, k.AllBindings()), prefix(rw, k.EmptiedDir()),
			prefix(rw, k.Placers()), prefix(rw, k.Elections()),
			// Quota usage marks, compared by every bind against a quota.
			prefix(rw, k.UsageDir()),
			// Sessions' secrets: the bind reads them and copies them to
			// each bound node (boundsecrets/<node>/), node loss deletes
			// those copies, the array controller writes its elements',
			// retention deletes them (and an older session's Ray token).
			prefix(rw, k.SpecSecretsDir()), prefix(rw, k.BoundSecretsDir()),
			prefix(rw, k.RayTokens()),
			// The array controller: elements created, results folded in;
			// retention deletes a finished array.
			prefix(rw, k.Arrays()),
			// The usage accountant: accruals, daily GPU-hours, its cursor;
			// owners' run times, which it learns and the placer reads.
			prefix(rw, k.Accruals()), prefix(rw, k.GPUHoursDir()), prefix(rw, k.Cursors()), prefix(r, k.Teams()),
			prefix(rw, k.RuntimesDir()),
			prefix(r, k.Nodes()), prefix(r, k.Cordons()), prefix(r, k.Quotas()), prefix(r, k.Profiles()),
			// Its HTTPS endpoint's record, which agents deny sessions.
			prefix(rw, k.ControlPlaneKind(state.EndpointPlacer)),
		}},
		{Name: Operator, Perms: operatorPerms(k, probe)},
	}
	sorted := slices.Clone(nodes)
	slices.Sort(sorted)
	for _, n := range slices.Compact(sorted) {
		roles = append(roles, Role{Name: Agent(n), Perms: []Perm{
			probe,
			// Its own node: inventory, ledger (release) and when it was
			// last emptied (emptied/<node>, with the release), bindings (delete
			// on release), secrets, and the parts it reports of its
			// sessions (parts/<node>/): the placers' merger turns them
			// into statuses, which no agent writes.
			exact(rw, k.Node(n)), exact(rw, k.Ledger(n)), exact(rw, k.Emptied(n)),
			prefix(rw, k.Bindings(n)), prefix(rw, k.NodeSecrets(n)),
			prefix(rw, k.NodeParts(n)),
			// Specs of its sessions; statuses (a gang's parts end with
			// their session; where the other parts run); the head's
			// binding and node for Ray workers.
			prefix(r, k.Sessions()), prefix(r, k.StatusDir()), prefix(r, k.AllBindings()), prefix(r, k.Nodes()),
			// Other nodes' parts: a multi-node job's part waits for its
			// peers' container addresses there.
			prefix(r, k.Parts()),
			// The secrets of the sessions bound to it (environment
			// values, Ray tokens), which the bind copies there, and no
			// other node's; it deletes them with the binding.
			prefix(rw, k.NodeBoundSecrets(n)),
			// Its HTTPS endpoint's record; every control-plane record,
			// whose endpoints it denies its sessions.
			exact(rw, k.ControlPlane(state.EndpointAgent, n)), prefix(r, k.ControlPlaneDir()),
			// Its subnet claim, written once no other node's claim
			// overlaps: it reads them all.
			exact(rw, k.Subnet(n)), prefix(r, k.SubnetsDir()),
		}})
	}
	return roles
}

// operatorPerms reads every directory but the secrets ones (secrets/,
// specsecrets/, boundsecrets/, raytokens/): one range per
// directory, since a prefix range over the whole of k would include it.
func operatorPerms(k state.Keys, probe Perm) []Perm {
	out := []Perm{probe}
	for _, d := range []string{
		k.Sessions(), k.PendingDir(), k.StatusDir(), k.Warnings(), k.Nodes(), k.Ledgers(),
		k.AllBindings(), k.Cordons(), k.Quotas(), k.Profiles(), k.Placers(), k.Elections(),
		k.IdempotencyDir(), k.UIDs(), k.UsageDir(), k.Parts(), k.Volumes(), k.Arrays(), k.ControlPlaneDir(),
		k.Teams(), k.Accruals(), k.GPUHoursDir(), k.Cursors(), k.EmptiedDir(), k.SubnetsDir(), k.RuntimesDir(),
	} {
		out = append(out, prefix(clientv3.PermRead, d))
	}
	return out
}

// Find returns the role named name in roles.
func Find(roles []Role, name string) (Role, error) {
	for _, r := range roles {
		if r.Name == name {
			return r, nil
		}
	}
	return Role{}, fmt.Errorf("find role %q: no such role in the table", name)
}
