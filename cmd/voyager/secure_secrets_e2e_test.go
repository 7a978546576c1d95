package main

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/state"
)

// checkSecrets runs a job with a secret in its environment and, while it
// runs, attacks the secret with every component's certificate: the job
// sees its value (the agent of its node read its copy); the agent of the
// other node cannot read that copy, nor the session's secrets record, nor
// another node's range; the operator reads the spec with the value held
// empty and reads neither secrets directory; the API reads the record it
// wrote. Last, the release deletes the node's copy.
func (c *secureCluster) checkSecrets(ctx context.Context, env []string, nodes []string) {
	t := c.t
	t.Helper()
	const secret = "sk-vdep-do-not-leak-0123456789"
	code, out := runVoyager(t, env, "session", "create", "--kind", "batch", "--gpus", "1", "-o", "name",
		"--env", "API_KEY="+secret, "--", "sh", "-c", `echo "key=$API_KEY"; sleep 600`)
	if code != 0 {
		t.Fatalf("create a session with a secret: exit %d\n%s", code, out)
	}
	id := strings.TrimSpace(out)
	defer runVoyager(t, env, "session", "stop", id)
	if code, out := runVoyager(t, env, "session", "wait", "--timeout", "90s", id); code != 0 {
		t.Fatalf("session wait %s: exit %d\n%s", id, code, out)
	}
	operator, root := c.client(etcdrbac.Operator), c.client(etcdrbac.Root)
	st, _, err := state.Get[state.Status](ctx, operator, keys.Status(id))
	if err != nil || len(st.Nodes) != 1 {
		t.Fatalf("status of %s: %+v, %v", id, st, err)
	}
	node := st.Nodes[0]
	other := nodes[0]
	if other == node {
		other = nodes[1]
	}
	// The job got the value: its agent read its node's copy.
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, logs := runVoyager(t, env, "session", "logs", id)
		if strings.Contains(logs, "key="+secret) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job never printed its secret: logs %q", logs)
		}
		time.Sleep(500 * time.Millisecond) // polling the job's log, with a deadline
	}
	own, err := c.client(etcdrbac.Agent(node)).Get(ctx, keys.BoundSecrets(node, id))
	if err != nil || len(own.Kvs) != 1 || !strings.Contains(string(own.Kvs[0].Value), secret) {
		t.Errorf("agent of %s reading its own copy of %s's secrets: %v %v", node, id, own, err)
	}
	// Nobody else reads it.
	denied := []struct {
		who, key string
		prefix   bool
	}{
		{etcdrbac.Agent(other), keys.BoundSecrets(node, id), false},
		{etcdrbac.Agent(other), keys.BoundSecretsDir(), true},
		{etcdrbac.Agent(other), keys.SpecSecrets(id), false},
		{etcdrbac.Agent(node), keys.SpecSecrets(id), false},
		{etcdrbac.Operator, keys.SpecSecretsDir(), true},
		{etcdrbac.Operator, keys.BoundSecretsDir(), true},
		{etcdrbac.Operator, keys.RayTokens(), true},
	}
	for _, d := range denied {
		var opts []clientv3.OpOption
		if d.prefix {
			opts = append(opts, clientv3.WithPrefix())
		}
		if _, err := c.client(d.who).Get(ctx, d.key, opts...); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s reading %s: %v, want permission denied", d.who, d.key, err)
		}
	}
	// The operator reads the spec, redacted: the variable's name, no value.
	spec, _, err := state.Get[state.Session](ctx, operator, keys.Session(id))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := spec.Env["API_KEY"]; !ok || v != "" || !spec.SecretEnv {
		t.Errorf("the operator reads the spec's env %v (secretEnv %v); want API_KEY with its value held out", spec.Env, spec.SecretEnv)
	}
	all, err := operator.Get(ctx, keys.Sessions(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range all.Kvs {
		if strings.Contains(string(kv.Value), secret) {
			t.Errorf("the operator reads the secret in %s", kv.Key)
		}
	}
	if sec, _, err := state.Get[state.SpecSecrets](ctx, c.client(etcdrbac.API), keys.SpecSecrets(id)); err != nil || sec.Env["API_KEY"] != secret {
		t.Errorf("the API reading the secrets it wrote: %+v, %v", sec, err)
	}
	// The release takes the node's copy with the binding.
	if code, out := runVoyager(t, env, "session", "stop", id); code != 0 {
		t.Fatalf("stop %s: exit %d\n%s", id, code, out)
	}
	waitReleased(t, ctx, root, id, 60*time.Second)
	if r, err := root.Get(ctx, keys.BoundSecrets(node, id)); err != nil || len(r.Kvs) != 0 {
		t.Errorf("the copy of %s's secrets on %s outlived its release: %v %v", id, node, r, err)
	}
}
