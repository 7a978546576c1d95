package etcdrbac_test

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"

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
		keys := []string{k.All() + m[1] + "/gpu-1", k.All() + m[1] + "/gpu-1/x"}
		readable := false
		for _, p := range operator.Perms {
			readable = readable || covers(p, keys[1], false)
		}
		if m[1] == "secrets" || m[1] == "raytokens" {
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
