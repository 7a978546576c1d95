package etcdrbac_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/pki"
	"github.com/voyager-gpu/voyager/state"
)

// op is one request a component's user makes.
type op struct {
	name string
	do   func(ctx context.Context, cli *clientv3.Client, k state.Keys) error
}

func put(key func(k state.Keys) string) op {
	return op{"put " + key(state.MustKeys(state.DefaultPrefix)), func(ctx context.Context, cli *clientv3.Client, k state.Keys) error {
		_, err := cli.Put(ctx, key(k), `{}`)
		return err
	}}
}

func del(key func(k state.Keys) string) op {
	return op{"delete " + key(state.MustKeys(state.DefaultPrefix)), func(ctx context.Context, cli *clientv3.Client, k state.Keys) error {
		_, err := cli.Delete(ctx, key(k))
		return err
	}}
}

func get(key func(k state.Keys) string) op {
	return op{"get " + key(state.MustKeys(state.DefaultPrefix)), func(ctx context.Context, cli *clientv3.Client, k state.Keys) error {
		_, err := cli.Get(ctx, key(k))
		return err
	}}
}

func list(key func(k state.Keys) string) op {
	return op{"list " + key(state.MustKeys(state.DefaultPrefix)), func(ctx context.Context, cli *clientv3.Client, k state.Keys) error {
		_, err := cli.Get(ctx, key(k), clientv3.WithPrefix())
		return err
	}}
}

// TestRolesOnRealEtcd sets the roles up on Debian's etcd with TLS and
// client-certificate authentication, and has every component's user try
// what it needs (allowed) and what belongs to others (refused).
func TestRolesOnRealEtcd(t *testing.T) {
	srv := etcdtest.StartSecure(t)
	root := srv.Client(t, etcdrbac.Root)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k := state.MustKeys(state.DefaultPrefix)
	roles := etcdrbac.Roles(k, []string{"gpu-a", "gpu-b"})

	n, err := etcdrbac.Setup(ctx, root, roles, etcdrbac.SetupOptions{Passwords: map[string]string{etcdrbac.Operator: "op-secret"}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if n == 0 {
		t.Fatal("setup on a fresh etcd reported no changes")
	}
	if n, err := etcdrbac.Setup(ctx, root, roles, etcdrbac.SetupOptions{Passwords: map[string]string{etcdrbac.Operator: "op-secret"}}); err != nil || n != 0 {
		t.Fatalf("second setup: %d changes, err %v; want 0 changes (idempotent)", n, err)
	}
	if diffs, err := etcdrbac.Check(ctx, root, roles); err != nil || len(diffs) != 0 {
		t.Fatalf("check after setup: %v, %v; want no differences", diffs, err)
	}

	type probe struct {
		op    op
		allow bool
	}
	allow := func(o op) probe { return probe{o, true} }
	deny := func(o op) probe { return probe{o, false} }
	cases := []struct {
		user   string
		probes []probe
	}{
		{etcdrbac.Agent("gpu-a"), []probe{
			allow(put(func(k state.Keys) string { return k.Node("gpu-a") })),
			allow(put(func(k state.Keys) string { return k.Ledger("gpu-a") })),
			// When its ledger emptied, written by its release.
			allow(put(func(k state.Keys) string { return k.Emptied("gpu-a") })),
			deny(put(func(k state.Keys) string { return k.Emptied("gpu-b") })),
			allow(del(func(k state.Keys) string { return k.Binding("gpu-a", "s1") })),
			allow(put(func(k state.Keys) string { return k.Secret("gpu-a", "s1") })),
			allow(get(func(k state.Keys) string { return k.Session("s1") })),
			allow(get(func(k state.Keys) string { return k.Binding("gpu-b", "s1") })),
			allow(list(func(k state.Keys) string { return k.Bindings("gpu-a") })),
			allow(get(func(k state.Keys) string { return k.Prefix() })),
			// Its own parts; statuses it reads but never writes: the
			// placers' merger writes them from the parts.
			allow(put(func(k state.Keys) string { return k.Part("gpu-a", "s1") })),
			allow(del(func(k state.Keys) string { return k.Part("gpu-a", "s1") })),
			allow(get(func(k state.Keys) string { return k.Status("s1") })),
			deny(put(func(k state.Keys) string { return k.Status("s1") })),
			deny(del(func(k state.Keys) string { return k.Status("s1") })),
			deny(put(func(k state.Keys) string { return k.Part("gpu-b", "s1") })),
			deny(put(func(k state.Keys) string { return k.Part("gpu-ab", "s1") })),
			deny(put(func(k state.Keys) string { return k.Node("gpu-b") })),
			deny(put(func(k state.Keys) string { return k.Ledger("gpu-b") })),
			deny(put(func(k state.Keys) string { return k.Binding("gpu-b", "s1") })),
			deny(del(func(k state.Keys) string { return k.Binding("gpu-b", "s1") })),
			// A node whose name starts with another's gets nothing of it.
			deny(put(func(k state.Keys) string { return k.Node("gpu-ab") })),
			deny(put(func(k state.Keys) string { return k.Binding("gpu-ab", "s1") })),
			deny(get(func(k state.Keys) string { return k.Secret("gpu-b", "s1") })),
			deny(put(func(k state.Keys) string { return k.Secret("gpu-b", "s1") })),
			deny(put(func(k state.Keys) string { return k.Session("s1") })),
			deny(put(func(k state.Keys) string { return k.Pending("s1") })),
			deny(put(func(k state.Keys) string { return k.Cordon("gpu-a") })),
			deny(list(func(k state.Keys) string { return k.All() })),
			// A session's volumes are in its spec: agents never read
			// the definitions.
			deny(get(func(k state.Keys) string { return k.Volume("data") })),
			// Secrets: its own node's copies only (environment values,
			// Ray tokens), never another node's, never the originals.
			allow(get(func(k state.Keys) string { return k.BoundSecrets("gpu-a", "s1") })),
			allow(list(func(k state.Keys) string { return k.NodeBoundSecrets("gpu-a") })),
			allow(del(func(k state.Keys) string { return k.BoundSecrets("gpu-a", "s1") })),
			deny(get(func(k state.Keys) string { return k.BoundSecrets("gpu-b", "s1") })),
			deny(get(func(k state.Keys) string { return k.BoundSecrets("gpu-ab", "s1") })),
			deny(list(func(k state.Keys) string { return k.BoundSecretsDir() })),
			deny(put(func(k state.Keys) string { return k.BoundSecrets("gpu-b", "s1") })),
			deny(get(func(k state.Keys) string { return k.SpecSecrets("s1") })),
			deny(get(func(k state.Keys) string { return k.RayToken("s1") })),
			// Its own endpoint record; every record it reads.
			allow(put(func(k state.Keys) string { return k.ControlPlane(state.EndpointAgent, "gpu-a") })),
			allow(list(func(k state.Keys) string { return k.ControlPlaneDir() })),
			deny(put(func(k state.Keys) string { return k.ControlPlane(state.EndpointAgent, "gpu-b") })),
			deny(del(func(k state.Keys) string { return k.ControlPlane(state.EndpointAPI, "x") })),
		}},
		{etcdrbac.Operator, []probe{
			allow(list(func(k state.Keys) string { return k.Sessions() })),
			allow(list(func(k state.Keys) string { return k.StatusDir() })),
			allow(list(func(k state.Keys) string { return k.Ledgers() })),
			allow(list(func(k state.Keys) string { return k.Elections() })),
			allow(list(func(k state.Keys) string { return k.Parts() })),
			deny(put(func(k state.Keys) string { return k.Part("gpu-a", "s1") })),
			allow(list(func(k state.Keys) string { return k.Volumes() })),
			deny(list(func(k state.Keys) string { return k.SecretsDir() })),
			deny(get(func(k state.Keys) string { return k.Secret("gpu-a", "s1") })),
			deny(list(func(k state.Keys) string { return k.All() })),
			deny(put(func(k state.Keys) string { return k.Status("s1") })),
			deny(put(func(k state.Keys) string { return k.Cordon("gpu-a") })),
			deny(list(func(k state.Keys) string { return k.SpecSecretsDir() })),
			deny(get(func(k state.Keys) string { return k.SpecSecrets("s1") })),
			deny(list(func(k state.Keys) string { return k.BoundSecretsDir() })),
			deny(get(func(k state.Keys) string { return k.BoundSecrets("gpu-a", "s1") })),
			deny(get(func(k state.Keys) string { return k.RayToken("s1") })),
			allow(list(func(k state.Keys) string { return k.RuntimesDir() })),
			deny(put(func(k state.Keys) string { return k.Runtimes("ada") })),
		}},
		{etcdrbac.API, []probe{
			allow(put(func(k state.Keys) string { return k.Session("s1") })),
			allow(put(func(k state.Keys) string { return k.Pending("s1") })),
			allow(put(func(k state.Keys) string { return k.Cordon("gpu-a") })),
			allow(list(func(k state.Keys) string { return k.SecretsDir() })),
			allow(list(func(k state.Keys) string { return k.Ledgers() })),
			allow(put(func(k state.Keys) string { return k.Volume("data") })),
			deny(put(func(k state.Keys) string { return k.Ledger("gpu-a") })),
			deny(put(func(k state.Keys) string { return k.Binding("gpu-a", "s1") })),
			deny(put(func(k state.Keys) string { return k.Node("gpu-a") })),
			deny(put(func(k state.Keys) string { return k.Secret("gpu-a", "s1") })),
			allow(put(func(k state.Keys) string { return k.SpecSecrets("s1") })),
			allow(list(func(k state.Keys) string { return k.SpecSecretsDir() })),
			deny(get(func(k state.Keys) string { return k.BoundSecrets("gpu-a", "s1") })),
			// Run times are the usage accountant's to write; the queue
			// view reads them.
			deny(put(func(k state.Keys) string { return k.Runtimes("ada") })),
			allow(list(func(k state.Keys) string { return k.RuntimesDir() })),
			allow(get(func(k state.Keys) string { return k.Runtimes("ada") })),
		}},
		{etcdrbac.Placer, []probe{
			allow(put(func(k state.Keys) string { return k.Ledger("gpu-a") })),
			allow(put(func(k state.Keys) string { return k.Binding("gpu-b", "s1") })),
			deny(del(func(k state.Keys) string { return k.Secret("gpu-a", "s1") })),
			allow(put(func(k state.Keys) string { return k.Elections() + "lifecycle/1" })),
			allow(put(func(k state.Keys) string { return k.Status("s1") })),
			allow(del(func(k state.Keys) string { return k.Part("gpu-a", "s1") })),
			allow(list(func(k state.Keys) string { return k.Parts() })),
			deny(get(func(k state.Keys) string { return k.Secret("gpu-a", "s1") })),
			deny(put(func(k state.Keys) string { return k.Node("gpu-a") })),
			deny(put(func(k state.Keys) string { return k.Cordon("gpu-a") })),
			deny(put(func(k state.Keys) string { return k.Profile("p") })),
			allow(get(func(k state.Keys) string { return k.SpecSecrets("s1") })),
			allow(put(func(k state.Keys) string { return k.BoundSecrets("gpu-b", "s1") })),
			allow(del(func(k state.Keys) string { return k.BoundSecrets("gpu-a", "s1") })),
			// The usage accountant learns owners' run times; the placer
			// reads them.
			allow(put(func(k state.Keys) string { return k.Runtimes("ada") })),
			allow(list(func(k state.Keys) string { return k.RuntimesDir() })),
		}},
	}
	for _, c := range cases {
		cli := srv.Client(t, c.user)
		for _, p := range c.probes {
			t.Run(c.user+"/"+p.op.name, func(t *testing.T) {
				err := p.op.do(ctx, cli, k)
				switch {
				case p.allow && err != nil:
					t.Errorf("refused: %v; %s needs it", err, c.user)
				case !p.allow && err == nil:
					t.Errorf("allowed; %s must be refused it", c.user)
				case !p.allow && !errors.Is(err, rpctypes.ErrPermissionDenied):
					t.Errorf("refused with %v, want permission denied", err)
				}
			})
		}
	}

	t.Run("unknown user", func(t *testing.T) {
		cli := srv.Client(t, "nobody")
		if _, err := cli.Get(ctx, k.Sessions(), clientv3.WithPrefix()); err == nil {
			t.Fatal("a certificate whose CN is no etcd user read sessions")
		}
	})

	t.Run("drift", func(t *testing.T) {
		if _, err := root.RoleGrantPermission(ctx, etcdrbac.Operator, k.SecretsDir(), clientv3.GetPrefixRangeEnd(k.SecretsDir()), clientv3.PermissionType(clientv3.PermRead)); err != nil {
			t.Fatal(err)
		}
		diffs, err := etcdrbac.Check(ctx, root, roles)
		if err != nil {
			t.Fatal(err)
		}
		if len(diffs) != 1 || !strings.Contains(diffs[0], "secrets") {
			t.Fatalf("check after granting the operator secrets/: %q, want that one difference", diffs)
		}
		if n, err := etcdrbac.Setup(ctx, root, roles, etcdrbac.SetupOptions{}); err != nil || n != 1 {
			t.Fatalf("setup after drift: %d changes, %v; want 1 (the revoke)", n, err)
		}
		if diffs, _ := etcdrbac.Check(ctx, root, roles); len(diffs) != 0 {
			t.Fatalf("check after repair: %q", diffs)
		}
	})
}

// TestRefusesForeignClients: a client with no certificate, or one of
// another CA, is refused by etcd's TLS.
func TestRefusesForeignClients(t *testing.T) {
	srv := etcdtest.StartSecure(t)
	other, err := pki.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := other.Issue(pki.Request{CommonName: etcdrbac.Root, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]*tls.Config{
		"no certificate":    {},
		"another CA's cert": {Certificates: []tls.Certificate{pair}},
	} {
		t.Run(name, func(t *testing.T) {
			cli := srv.ClientTLS(t, tc)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if _, err := cli.Get(ctx, "/voyager"); err == nil {
				t.Fatal("etcd answered")
			}
		})
	}
}
