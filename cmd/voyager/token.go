package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/config"
)

var tokenCmd = subcommand{
	name: "token",
	description: `Prints a JWT signed with the configured HS256 secret (VOYAGER_JWT_SECRET, or
the one voyager dev keeps in <data dir>/jwt-secret), for development and
tests: export VOYAGER_TOKEN=$(voyager token). Anyone with the secret can mint
any token; production deployments use their identity provider instead.`,
	envs: []string{config.EnvJWTSecret, config.EnvDataDir, config.EnvJWTAudience, config.EnvJWTIssuer,
		config.EnvJWTRolesClaim, config.EnvJWTGroupsClaim, config.EnvJWTAdminRole},
}

func runToken(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := tokenCmd.flagSet()
	sub := fs.String("sub", defaultUser(), "subject: the user the token names")
	var roles, groups multiFlag
	fs.Var(&roles, "role", "a role (repeatable), e.g. admin or service")
	fs.Var(&groups, "group", "a group (repeatable)")
	admin := fs.Bool("admin", false, "add the admin role")
	ttl := fs.Duration("ttl", 12*time.Hour, "lifetime")
	if code := tokenCmd.parse(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	cfg, err := config.Load(os.Environ(), fs)
	if err != nil {
		writeConfigError(stderr, "token", err)
		return exitUsage
	}
	if *admin {
		roles = append(roles, cfg.JWTAdminRole)
	}
	secret, err := devSecret(cfg, false)
	if err != nil {
		fmt.Fprintf(stderr, "voyager token: %v (start voyager dev once, or set %s)\n", err, config.EnvJWTSecret)
		return exitUsage
	}
	tok, err := api.MintHS256(secret, api.TokenClaims{
		Subject: *sub, Roles: roles, Groups: groups, TTL: *ttl,
		Audience: cfg.JWTAudience, Issuer: cfg.JWTIssuer,
		RolesClaim: cfg.JWTRolesClaim, GroupsClaim: cfg.JWTGroupsClaim,
	}, time.Now())
	if err != nil {
		fmt.Fprintf(stderr, "voyager token: %v\n", err)
		return exitError
	}
	fmt.Fprintln(stdout, tok)
	return exitOK
}

func defaultUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return strings.ReplaceAll(u.Username, " ", "_")
	}
	return "dev"
}
