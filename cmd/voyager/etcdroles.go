package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/state"
)

var etcdRolesCmd = subcommand{
	name: "etcd-roles",
	args: "setup|check|list",
	description: `Manages Voyager's etcd users and roles (docs/deployment.md): one role per
component with the least key ranges it needs, and one user of the same name.

  setup  makes etcd's roles, users and grants equal to the table, creates the
         root user and turns authentication on; run it again at any time (it
         changes only what differs), e.g. after adding a -node
  check  lists every difference between etcd and the table; exit status 1
         when there is one
  list   prints the table without connecting

Connect as etcd's root: a client certificate with CN root (voyager certs
writes root.pem) or VOYAGER_ETCD_USER=root with a password file. Users log
in with client certificates whose CN is their name; -password-dir DIR gives
user U the password in DIR/U as well.`,
	envs: []string{
		config.EnvEtcdEndpoints, config.EnvEtcdPrefix, config.EnvEtcdDialTimeout,
		config.EnvEtcdCA, config.EnvEtcdCert, config.EnvEtcdKey, config.EnvEtcdServerName,
		config.EnvEtcdUser, config.EnvEtcdPassword,
	},
}

func runEtcdRoles(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := etcdRolesCmd.flagSet()
	var nodes multiFlag
	fs.Var(&nodes, "node", "a GPU machine's node name (repeatable, or comma-separated): its agent's role")
	nodesFromEtcd := fs.Bool("nodes-from-etcd", false, "also give a role to every node registered in etcd now (nodes/ and ledger/)")
	pwDir := fs.String("password-dir", "", "directory of password files, one per user, named like the user")
	// The verb may come first (voyager etcd-roles setup -node gpu-1).
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		args = append(append([]string(nil), args[1:]...), args[0])
	}
	if code := etcdRolesCmd.parse(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() != 1 || !strings.Contains("|setup|check|list|", "|"+fs.Arg(0)+"|") {
		fmt.Fprintln(stderr, "voyager etcd-roles: want one of setup, check, list")
		return exitUsage
	}
	cfg, err := config.Load(os.Environ(), fs)
	if err != nil {
		writeConfigError(stderr, "etcd-roles", err)
		return exitUsage
	}
	keys := state.MustKeys(cfg.EtcdPrefix)
	var names []string
	for _, n := range nodes {
		for _, s := range strings.Split(n, ",") {
			if s = strings.TrimSpace(s); s != "" {
				if err := state.ValidateName("node name", s); err != nil {
					fmt.Fprintf(stderr, "voyager etcd-roles: -node: %v\n", err)
					return exitUsage
				}
				names = append(names, s)
			}
		}
	}
	if fs.Arg(0) == "list" {
		for _, r := range etcdrbac.Roles(keys, names) {
			fmt.Fprintf(stdout, "%s\n", r.Name)
			for _, p := range r.Perms {
				fmt.Fprintf(stdout, "  %s\n", p)
			}
		}
		return exitOK
	}
	if err := cfg.RequireEndpoints(); err != nil {
		writeConfigError(stderr, "etcd-roles", err)
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
	if *nodesFromEtcd {
		found, err := registeredNodes(cctx, cli, keys)
		if err != nil {
			fmt.Fprintf(stderr, "voyager etcd-roles: %v\n", err)
			return exitError
		}
		names = append(names, found...)
	}
	roles := etcdrbac.Roles(keys, names)
	switch fs.Arg(0) {
	case "setup":
		pws, err := readPasswords(*pwDir, roles)
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
		for _, d := range diffs {
			fmt.Fprintln(stdout, d)
		}
		if len(diffs) > 0 {
			return exitError
		}
		fmt.Fprintf(stdout, "ok: %d roles as in the table, authentication on\n", len(roles))
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
