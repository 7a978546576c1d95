package main

import (
	"fmt"
	"os/user"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/config"
)

const tokenLong = `Prints a JWT signed with the configured HS256 secret (VOYAGER_JWT_SECRET, or
the one voyager dev keeps in <data dir>/jwt-secret), for development and
tests: export VOYAGER_TOKEN=$(voyager token). Anyone with the secret can mint
any token; production deployments use their identity provider instead.`

func newTokenCmd() *cobra.Command {
	var (
		sub           string
		roles, groups []string
		admin         bool
		ttl           time.Duration
	)
	cmd := &cobra.Command{
		Use:     "token",
		Short:   "Print a development token signed with the configured secret",
		Long:    tokenLong,
		Example: "  export VOYAGER_TOKEN=$(voyager token)\n  voyager token --sub jupyterhub --role service",
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			if admin {
				roles = append(roles, cfg.JWTAdminRole)
			}
			secret, err := devSecret(cfg, false)
			if err != nil {
				fmt.Fprintf(stderr, "voyager token: %v (start voyager dev once, or set %s)\n", err, config.EnvJWTSecret)
				return exitCode(exitUsage)
			}
			tok, err := api.MintHS256(secret, api.TokenClaims{
				Subject: sub, Roles: roles, Groups: groups, TTL: ttl,
				Audience: cfg.JWTAudience, Issuer: cfg.JWTIssuer,
				RolesClaim: cfg.JWTRolesClaim, GroupsClaim: cfg.JWTGroupsClaim,
			}, time.Now())
			if err != nil {
				fmt.Fprintf(stderr, "voyager token: %v\n", err)
				return exitCode(exitError)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&sub, "sub", defaultUser(), "subject: the user the token names")
	f.StringArrayVar(&roles, "role", nil, "a role (repeatable), e.g. admin or service")
	f.StringArrayVar(&groups, "group", nil, "a group (repeatable)")
	f.BoolVar(&admin, "admin", false, "add the admin role")
	f.DurationVar(&ttl, "ttl", 12*time.Hour, "lifetime")
	_ = cmd.RegisterFlagCompletionFunc("role", cobra.FixedCompletions([]cobra.Completion{"admin", "service"}, cobra.ShellCompDirectiveNoFileComp))
	return withSettings(cmd, config.EnvJWTSecret, config.EnvDataDir, config.EnvJWTAudience, config.EnvJWTIssuer,
		config.EnvJWTRolesClaim, config.EnvJWTGroupsClaim, config.EnvJWTAdminRole)
}

func defaultUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return strings.ReplaceAll(u.Username, " ", "_")
	}
	return "dev"
}
