package etcdrbac

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SetupOptions adjust Setup.
type SetupOptions struct {
	// Passwords gives users (role names, or Root) a password. A user
	// without one logs in only with a client certificate whose CN is its
	// name (etcd's --client-cert-auth); an existing user's password is
	// changed to the one given.
	Passwords map[string]string
	// Log, when set, receives one line per change made.
	Log func(format string, args ...any)
}

// Setup makes etcd's roles, users and grants equal to roles, creates the
// root user if absent, and turns authentication on. It is idempotent: run
// again it changes nothing, and on a changed table it adds and revokes
// only the difference. After authentication is on, cli must be root's.
// It returns the number of changes made.
func Setup(ctx context.Context, cli *clientv3.Client, roles []Role, opts SetupOptions) (int, error) {
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	changes := 0
	note := func(format string, args ...any) {
		changes++
		logf(format, args...)
	}
	for _, r := range roles {
		if _, err := cli.RoleAdd(ctx, r.Name); err == nil {
			note("role %s: created", r.Name)
		} else if !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
			return changes, fmt.Errorf("add role %s: %w", r.Name, err)
		}
		have, err := cli.RoleGet(ctx, r.Name)
		if err != nil {
			return changes, fmt.Errorf("read role %s: %w", r.Name, err)
		}
		for _, p := range have.Perm {
			got := Perm{Key: string(p.Key), End: string(p.RangeEnd), Type: p.PermType}
			if slices.Contains(r.Perms, got) {
				continue
			}
			if _, err := cli.RoleRevokePermission(ctx, r.Name, got.Key, got.End); err != nil {
				return changes, fmt.Errorf("revoke %s from role %s: %w", got, r.Name, err)
			}
			note("role %s: revoked %s", r.Name, got)
		}
		for _, p := range r.Perms {
			if slices.ContainsFunc(have.Perm, func(h *authpb.Permission) bool {
				return string(h.Key) == p.Key && string(h.RangeEnd) == p.End && h.PermType == p.Type
			}) {
				continue
			}
			if _, err := cli.RoleGrantPermission(ctx, r.Name, p.Key, p.End, clientv3.PermissionType(p.Type)); err != nil {
				return changes, fmt.Errorf("grant %s to role %s: %w", p, r.Name, err)
			}
			note("role %s: granted %s", r.Name, p)
		}
		if err := ensureUser(ctx, cli, r.Name, r.Name, opts.Passwords, note); err != nil {
			return changes, err
		}
	}
	// etcd turns authentication on only when root exists with the root role.
	if _, err := cli.RoleAdd(ctx, Root); err == nil {
		note("role root: created")
	} else if !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return changes, fmt.Errorf("add role root: %w", err)
	}
	if err := ensureUser(ctx, cli, Root, Root, opts.Passwords, note); err != nil {
		return changes, err
	}
	enabled, err := authEnabled(ctx, cli)
	if err != nil {
		return changes, err
	}
	if !enabled {
		if _, err := cli.AuthEnable(ctx); err != nil {
			return changes, fmt.Errorf("enable etcd authentication: %w", err)
		}
		note("authentication: enabled")
	}
	return changes, nil
}

// ensureUser makes user exist, hold exactly role, and have the password
// of passwords (if any).
func ensureUser(ctx context.Context, cli *clientv3.Client, user, role string, passwords map[string]string, note func(string, ...any)) error {
	pw, hasPW := passwords[user]
	var err error
	if hasPW {
		_, err = cli.UserAdd(ctx, user, pw)
	} else {
		_, err = cli.UserAddWithOptions(ctx, user, "", &clientv3.UserAddOptions{NoPassword: true})
	}
	switch {
	case err == nil:
		note("user %s: created", user)
	case errors.Is(err, rpctypes.ErrUserAlreadyExist):
		if hasPW {
			if _, err := cli.UserChangePassword(ctx, user, pw); err != nil {
				return fmt.Errorf("set password of user %s: %w", user, err)
			}
		}
	default:
		return fmt.Errorf("add user %s: %w", user, err)
	}
	u, err := cli.UserGet(ctx, user)
	if err != nil {
		return fmt.Errorf("read user %s: %w", user, err)
	}
	for _, r := range u.Roles {
		if r == role {
			continue
		}
		if _, err := cli.UserRevokeRole(ctx, user, r); err != nil {
			return fmt.Errorf("revoke role %s from user %s: %w", r, user, err)
		}
		note("user %s: revoked role %s", user, r)
	}
	if !slices.Contains(u.Roles, role) {
		if _, err := cli.UserGrantRole(ctx, user, role); err != nil {
			return fmt.Errorf("grant role %s to user %s: %w", role, user, err)
		}
		note("user %s: granted role %s", user, role)
	}
	return nil
}

// Check compares etcd's authentication state with roles and returns one
// line per difference (none: as it should be). Roles and users of
// Voyager's naming (voyager-…) that the table lacks are differences too: a
// decommissioned node's agent. cli must be root's.
func Check(ctx context.Context, cli *clientv3.Client, roles []Role) ([]string, error) {
	var diffs []string
	enabled, err := authEnabled(ctx, cli)
	if err != nil {
		return nil, err
	}
	if !enabled {
		diffs = append(diffs, "authentication is off: anyone who reaches etcd may do anything (run voyager etcd-roles setup)")
	}
	list, err := cli.RoleList(ctx)
	if err != nil {
		return nil, fmt.Errorf("list roles: %w", err)
	}
	want := map[string]bool{}
	for _, r := range roles {
		want[r.Name] = true
		if !slices.Contains(list.Roles, r.Name) {
			diffs = append(diffs, fmt.Sprintf("role %s: missing", r.Name))
			continue
		}
		have, err := cli.RoleGet(ctx, r.Name)
		if err != nil {
			return nil, fmt.Errorf("read role %s: %w", r.Name, err)
		}
		var got []Perm
		for _, p := range have.Perm {
			g := Perm{Key: string(p.Key), End: string(p.RangeEnd), Type: p.PermType}
			got = append(got, g)
			if !slices.Contains(r.Perms, g) {
				diffs = append(diffs, fmt.Sprintf("role %s: has %s, which the table does not grant", r.Name, g))
			}
		}
		for _, p := range r.Perms {
			if !slices.Contains(got, p) {
				diffs = append(diffs, fmt.Sprintf("role %s: lacks %s", r.Name, p))
			}
		}
		u, err := cli.UserGet(ctx, r.Name)
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("user %s: %v", r.Name, err))
			continue
		}
		if !slices.Equal(u.Roles, []string{r.Name}) {
			diffs = append(diffs, fmt.Sprintf("user %s: has roles %v, want only %s", r.Name, u.Roles, r.Name))
		}
	}
	for _, name := range list.Roles {
		if strings.HasPrefix(name, "voyager-") && !want[name] {
			diffs = append(diffs, fmt.Sprintf("role %s: not in the table (a removed node? delete it with etcdctl role delete %s)", name, name))
		}
	}
	return diffs, nil
}

// authEnabled asks etcd whether authentication is on. etcd 3.4 (Debian's)
// has no AuthStatus; there, a login attempt says it: "not enabled", or a
// refusal of the made-up password.
func authEnabled(ctx context.Context, cli *clientv3.Client) (bool, error) {
	st, err := cli.AuthStatus(ctx)
	if err == nil {
		return st.Enabled, nil
	}
	if status.Code(err) != codes.Unimplemented {
		return false, fmt.Errorf("read auth status: %w", err)
	}
	_, err = cli.Authenticate(ctx, Root, "voyager-probe-not-a-password")
	switch {
	case errors.Is(err, rpctypes.ErrAuthNotEnabled):
		return false, nil
	case ctx.Err() != nil:
		return false, fmt.Errorf("read auth status: %w", ctx.Err())
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false, fmt.Errorf("read auth status: %w", err)
	}
	// Any other answer is a login judged: authentication is on.
	return true, nil
}
