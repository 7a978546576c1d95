package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/state"
)

const etcdRolesLong = `Manages Voyager's etcd users and roles (docs/deployment.md): one role per
component with the least key ranges it needs, and one user of the same name.

  setup  makes etcd's roles, users and grants equal to the table, creates the
         root user and turns authentication on; run it again at any time (it
         changes only what differs), e.g. after adding a --node
  check  lists every difference between etcd and the table, and probes
         every member's ports: client URLs must be https and refuse a
         client without a certificate, peer URLs must be https and refuse
         no certificate and this client's (peers have a CA and CN of their
         own: voyager certs); exit status 1 when anything differs
  list   prints the table without connecting

Connect as etcd's root: a client certificate with CN root (voyager certs
writes root.pem) or VOYAGER_ETCD_USER=root with a password file. Users log
in with client certificates whose CN is their name; --password-dir DIR gives
user U the password in DIR/U as well.`

// etcdRolesOptions are voyager etcd-roles' flags.
type etcdRolesOptions struct {
	nodes         []string
	nodesFromEtcd bool
	passwordDir   string
}

func newEtcdRolesCmd() *cobra.Command {
	var o etcdRolesOptions
	cmd := &cobra.Command{
		Use:       "etcd-roles setup|check|list",
		Short:     "Set up or check Voyager's etcd users and roles (least rights per component)",
		Long:      etcdRolesLong,
		Example:   "  voyager etcd-roles setup --node gpu-1 --node gpu-2\n  voyager etcd-roles check --nodes-from-etcd",
		GroupID:   groupDeploy,
		Args:      cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs),
		ValidArgs: []string{"setup", "check", "list"},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			return withCode(runEtcdRoles(cmd.Context(), cfg, o, args, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.nodes, "node", nil, "a GPU machine's node name (repeatable, or comma-separated): its agent's role")
	f.BoolVar(&o.nodesFromEtcd, "nodes-from-etcd", false, "also give a role to every node registered in etcd now (nodes/ and ledger/)")
	f.StringVar(&o.passwordDir, "password-dir", "", "directory of password files, one per user, named like the user")
	return withSettings(cmd,
		config.EnvEtcdEndpoints, config.EnvEtcdPrefix, config.EnvEtcdDialTimeout,
		config.EnvEtcdCA, config.EnvEtcdCert, config.EnvEtcdKey, config.EnvEtcdServerName,
		config.EnvEtcdUser, config.EnvEtcdPassword,
	)
}

// runEtcdRoles runs one verb (args[0]) of voyager etcd-roles and returns
// the exit code.
func runEtcdRoles(ctx context.Context, cfg config.Config, o etcdRolesOptions, args []string, stdout, stderr io.Writer) int {
	keys := state.MustKeys(cfg.EtcdPrefix)
	var names []string
	for _, s := range o.nodes {
		if s = strings.TrimSpace(s); s != "" {
			if err := state.ValidateName("node name", s); err != nil {
				fmt.Fprintf(stderr, "voyager etcd-roles: --node: %v\n", err)
				return exitUsage
			}
			names = append(names, s)
		}
	}
	if args[0] == "list" {
		for _, r := range etcdrbac.Roles(keys, names) {
			fmt.Fprintf(stdout, "%s\n", r.Name)
			for _, p := range r.Perms {
				fmt.Fprintf(stdout, "  %s\n", p)
			}
		}
		return exitOK
	}
	if err := cfg.RequireEndpoints(); err != nil {
		writeConfigError(stderr, "voyager etcd-roles", err)
		return exitUsage
	}
	cc, err := cfg.EtcdClientConfig()
	if err != nil {
		fmt.Fprintf(stderr, "voyager etcd-roles: %v\n", err)
		return exitUsage
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		fmt.Fprintf(stderr, "voyager etcd-roles: connect to etcd: %v\n", err)
		return exitError
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*cfg.EtcdDialTimeout)
	defer cancel()
	if o.nodesFromEtcd {
		found, err := registeredNodes(cctx, cli, keys)
		if err != nil {
			fmt.Fprintf(stderr, "voyager etcd-roles: %v\n", err)
			return exitError
		}
		names = append(names, found...)
	}
	roles := etcdrbac.Roles(keys, names)
	switch args[0] {
	case "setup":
		pws, err := readPasswords(o.passwordDir, roles)
		if err != nil {
			fmt.Fprintf(stderr, "voyager etcd-roles: %v\n", err)
			return exitUsage
		}
		n, err := etcdrbac.Setup(cctx, cli, roles, etcdrbac.SetupOptions{
			Passwords: pws,
			Log:       func(format string, args ...any) { fmt.Fprintf(stdout, format+"\n", args...) },
		})
		if err != nil {
			fmt.Fprintf(stderr, "voyager etcd-roles setup: %v\n", err)
			return exitError
		}
		fmt.Fprintf(stdout, "%d changes; %d roles as in the table, authentication on\n", n, len(roles))
	case "check":
		diffs, err := etcdrbac.Check(cctx, cli, roles)
		if err != nil {
			fmt.Fprintf(stderr, "voyager etcd-roles check: %v\n", err)
			return exitError
		}
		diffs = append(diffs, transportDiffs(cctx, cli, cc.TLS)...)
		for _, d := range diffs {
			fmt.Fprintln(stdout, d)
		}
		if len(diffs) > 0 {
			return exitError
		}
		fmt.Fprintf(stdout, "ok: %d roles as in the table, authentication on; client ports refuse clients without a certificate, peer ports refuse client certificates\n", len(roles))
	}
	return exitOK
}

// registeredNodes lists the node names present in nodes/ and ledger/.
func registeredNodes(ctx context.Context, cli *clientv3.Client, k state.Keys) ([]string, error) {
	var out []string
	for _, dir := range []string{k.Nodes(), k.Ledgers()} {
		resp, err := cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		for _, kv := range resp.Kvs {
			if n, ok := k.NodeName(string(kv.Key)); ok {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// readPasswords reads DIR/<user> for each role's user and root; absent
// files mean certificate-only users.
func readPasswords(dir string, roles []etcdrbac.Role) (map[string]string, error) {
	if dir == "" {
		return nil, nil
	}
	users := []string{etcdrbac.Root}
	for _, r := range roles {
		users = append(users, r.Name)
	}
	out := map[string]string{}
	for _, u := range users {
		b, err := os.ReadFile(filepath.Join(dir, u))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read password of %s: %w", u, err)
		}
		pw, _, _ := strings.Cut(string(b), "\n")
		if pw = strings.TrimRight(pw, "\r"); pw == "" {
			return nil, fmt.Errorf("read password of %s: the first line of %s is empty", u, filepath.Join(dir, u))
		}
		out[u] = pw
	}
	return out, nil
}
