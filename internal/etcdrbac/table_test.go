package etcdrbac_test

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/state"
)

// TestTableCoversDocumentedKeys keeps the role table in step with the key
// schema: every directory of docs/state.md's key table is readable by the
// operator (but secrets/, which nobody but the API and agents reads) and
// writable by at least one role, so a new directory cannot be forgotten
// until a deployment with authentication refuses its writer.
func TestTableCoversDocumentedKeys(t *testing.T) {
	f, err := os.Open("../../docs/state.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	k := state.MustKeys(state.DefaultPrefix)
	roles := etcdrbac.Roles(k, []string{"gpu-1"})
	operator, err := etcdrbac.Find(roles, etcdrbac.Operator)
	if err != nil {
		t.Fatal(err)
	}
	covers := func(p etcdrbac.Perm, key string, write bool) bool {
		in := key == p.Key || (p.End != "" && key >= p.Key && key < p.End)
		if !in {
			return false
		}
		if write {
			return p.Type.String() != "READ"
		}
		return p.Type.String() != "WRITE"
	}
	row := regexp.MustCompile("^\\| `([a-z]+)/")
	inKeys, dirs := false, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## Keys"):
			inKeys = true
			continue
		case strings.HasPrefix(line, "## "):
			inKeys = false
		}
		m := row.FindStringSubmatch(line)
		if !inKeys || m == nil {
			continue
		}
		dirs++
		// A key of the directory: a node's own, or one under a node (the
		// per-node ranges of the agents' roles).
		// controlplane/ is by kind, then name (an agent's own: its node).
		keys := []string{k.All() + m[1] + "/gpu-1", k.All() + m[1] + "/gpu-1/x", k.All() + m[1] + "/agent/gpu-1"}
		readable := false
		for _, p := range operator.Perms {
			readable = readable || covers(p, keys[1], false)
		}
		if m[1] == "secrets" || m[1] == "raytokens" || m[1] == "specsecrets" || m[1] == "boundsecrets" {
			if readable {
				t.Errorf("the operator reads %s", m[1])
			}
		} else if !readable {
			t.Errorf("docs/state.md lists %s/, which the operator cannot read", m[1])
		}
		writable := false
		for _, r := range roles {
			for _, p := range r.Perms {
				for _, key := range keys {
					writable = writable || covers(p, key, true)
				}
			}
		}
		if !writable {
			t.Errorf("docs/state.md lists %s/, which no role may write", m[1])
		}
	}
	if dirs < 10 {
		t.Fatalf("read %d directories from docs/state.md's key table; the table moved?", dirs)
	}
}

// TestAgentWritesOnlyItsNode: every range an agent's role may write is
// its own node's (its node key, its ledger, or a prefix under
// <dir>/<node>/): no status, and nothing of another node.
func TestAgentWritesOnlyItsNode(t *testing.T) {
	k := state.MustKeys(state.DefaultPrefix)
	roles := etcdrbac.Roles(k, []string{"gpu-1", "gpu-10"})
	agent, err := etcdrbac.Find(roles, etcdrbac.Agent("gpu-1"))
	if err != nil {
		t.Fatal(err)
	}
	writes := 0
	for _, p := range agent.Perms {
		if p.Type.String() == "READ" {
			continue
		}
		writes++
		own := p.End == "" && (p.Key == k.Node("gpu-1") || p.Key == k.Ledger("gpu-1") || p.Key == k.Emptied("gpu-1") || p.Key == k.ControlPlane(state.EndpointAgent, "gpu-1") || p.Key == k.Subnet("gpu-1"))
		own = own || (strings.HasSuffix(p.Key, "/gpu-1/") && p.End == clientv3.GetPrefixRangeEnd(p.Key))
		if !own {
			t.Errorf("the agent of gpu-1 may %s: not its node's", p)
		}
		if strings.HasPrefix(p.Key, k.StatusDir()) {
			t.Errorf("the agent of gpu-1 may write statuses: %s", p)
		}
	}
	if writes < 5 {
		t.Errorf("the agent writes %d ranges, want its node, ledger, bindings, secrets and parts", writes)
	}
	placer, err := etcdrbac.Find(roles, etcdrbac.Placer)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(placer.Perms, func(p etcdrbac.Perm) bool { return p.Key == k.Parts() && p.Type.String() == "READWRITE" }) {
		t.Error("the placer's role cannot run the status merger: no readwrite on parts/")
	}
	// The usage accountant (in the placer process) learns run times,
	// which the placer reads.
	if !slices.ContainsFunc(placer.Perms, func(p etcdrbac.Perm) bool { return p.Key == k.RuntimesDir() && p.Type.String() == "READWRITE" }) {
		t.Error("the placer's role cannot learn run times: no readwrite on runtimes/")
	}
	// The API's queue view plans with them as the placer does
	// (TestRolesOnRealEtcd: it writes none).
	api, err := etcdrbac.Find(roles, etcdrbac.API)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(api.Perms, func(p etcdrbac.Perm) bool {
		return p.Key == k.RuntimesDir() && p.End == clientv3.GetPrefixRangeEnd(p.Key) && p.Type.String() == "READ"
	}) {
		t.Error("the API's role cannot plan the queue view as the placer does: no read on runtimes/")
	}
}
