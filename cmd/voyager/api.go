package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/console"
	"github.com/voyager-gpu/voyager/internal/audit"
	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/httpserver"
	"github.com/voyager-gpu/voyager/state"
)

// apiEnvs are the settings the API reads.
var apiEnvs = []string{
	config.EnvJWTSecret, config.EnvJWTPublicKeys, config.EnvJWTAudience, config.EnvJWTIssuer,
	config.EnvJWTRolesClaim, config.EnvJWTGroupsClaim, config.EnvJWTAdminRole, config.EnvJWTServiceRole,
	config.EnvAPIMaxBodyBytes, config.EnvAPIRate, config.EnvAPIBurst, config.EnvAPIIdempotencyTTL,
	config.EnvMaxRuntime, config.EnvMaxRuntimeCap, config.EnvHTTPPlain,
	config.EnvPlacerMaxTxnOps, config.EnvMinCPUMilli, config.EnvMinMemoryMiB, config.EnvMaxSessionsPerNode,
	config.EnvAPIRegistries, config.EnvAPIMaxQueued, config.EnvAPIExecAuditLog,
	config.EnvAPIAuditLog, config.EnvAPIAuditMaxMiB, config.EnvAPIAuditKeep,
	config.EnvDefaultShmMiB, config.EnvUlimitNofile, config.EnvUlimitMemlock, config.EnvNodePowerDownAfter,
	config.EnvPlacerUsageHalfLife, config.EnvPlacerRuntimeEstimates,
}

const apiLong = `Runs the HTTP API until SIGINT or SIGTERM: /api/v1/… (sessions, nodes,
the queue, profiles, quotas), /openapi.json, /healthz, /readyz and /metrics
on VOYAGER_HTTP_ADDR. Tokens are JWTs verified with VOYAGER_JWT_SECRET (HS256)
or VOYAGER_JWT_PUBLIC_KEYS (RS256/ES256); one of them is required. Run as many
as you like behind a load balancer: they share nothing but etcd.`

func newAPICmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "api",
		Short:   "Run the HTTP API (JWT-protected; any number may run)",
		Long:    apiLong,
		GroupID: groupProcesses,
		Args:    cobra.NoArgs,
		RunE:    runAPI,
	}
	return withSettings(cmd, append([]string{
		config.EnvEtcdEndpoints, config.EnvEtcdPrefix, config.EnvEtcdDialTimeout, config.EnvHTTPAddr,
		config.EnvLogLevel, config.EnvLogFormat, config.EnvPlacerStrategy, config.EnvPlacerReserveAfter, config.EnvPlacerShortFirst,
	}, append(apiEnvs, secureEnvs...)...)...)
}

func runAPI(cmd *cobra.Command, _ []string) error {
	cfg, err := loadClusterConfig(cmd)
	if err != nil {
		return err
	}
	if cfg.JWTSecret == "" && cfg.JWTPublicKeys == "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: no token verification configured: set %s (HS256) or %s (RS256/ES256 keys, PEM or JWKS)\n",
			cmd.CommandPath(), config.EnvJWTSecret, config.EnvJWTPublicKeys)
		return exitCode(exitUsage)
	}
	if err := cfg.RequireSecureHTTP(); err != nil {
		writeConfigError(cmd.ErrOrStderr(), cmd.CommandPath(), err)
		return exitCode(exitUsage)
	}
	return runProcess(cmd, "api", cfg, func(p *process) ([]component, error) {
		a, closeAudit, err := newAPI(p.cli, cfg, []byte(cfg.JWTSecret), p.log)
		if err != nil {
			return nil, err
		}
		p.onExit(closeAudit)
		registry := httpserver.NewRegistry()
		registry.MustRegister(a.Collectors()...)
		mux := http.NewServeMux()
		httpserver.Routes(mux, etcdProbes(registry, p.cli, cfg.EtcdPrefix))
		a.Mount(mux)
		if err := console.Mount(a.Engine(), mux, console.Config{Logger: p.log}); err != nil {
			return nil, err
		}
		hs, err := listenHTTP(cfg, mux, p.log)
		if err != nil {
			return nil, err
		}
		p.log.Info("api listening", "url", cfg.HTTPScheme()+"://"+hs.Addr()+"/api/v1/")
		return []component{
			httpComponent(hs),
			apiComponent(a),
			selfEndpoint(p.cli, cfg, state.EndpointAPI, hs.Addr(), p.log),
		}, nil
	})
}

// newAPI builds the API from the process configuration; secret is the
// HS256 secret (from the environment, or dev's generated one). The
// function it returns closes the audit log, after the HTTP server ends.
func newAPI(cli *clientv3.Client, cfg config.Config, secret []byte, log *slog.Logger) (*api.API, func(), error) {
	auditLog, err := openAuditLog(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	a, err := buildAPI(cli, cfg, secret, auditLog, log)
	if err != nil {
		closeAuditLog(auditLog)
		return nil, nil, err
	}
	return a, func() { closeAuditLog(auditLog) }, nil
}

// buildAPI is newAPI with the audit log opened (nil: none).
func buildAPI(cli *clientv3.Client, cfg config.Config, secret []byte, auditLog *audit.Log, log *slog.Logger) (*api.API, error) {
	auth := api.AuthConfig{
		HS256Secret: secret,
		Audience:    cfg.JWTAudience,
		Issuer:      cfg.JWTIssuer,
		RolesClaim:  cfg.JWTRolesClaim,
		GroupsClaim: cfg.JWTGroupsClaim,
		AdminRole:   cfg.JWTAdminRole,
		ServiceRole: cfg.JWTServiceRole,
	}
	if cfg.JWTPublicKeys != "" {
		keys, err := api.LoadPublicKeys(cfg.JWTPublicKeys)
		if err != nil {
			return nil, fmt.Errorf("%w (%s)", err, config.EnvJWTPublicKeys)
		}
		auth.PublicKeys = keys
	}
	logs, err := logsHTTPClient(cfg)
	if err != nil {
		return nil, err
	}
	return api.New(cli, state.MustKeys(cfg.EtcdPrefix), api.Config{
		Auth:           auth,
		HTTPClient:     logs,
		MaxBodyBytes:   cfg.APIMaxBodyBytes,
		Rate:           cfg.APIRate,
		Burst:          cfg.APIBurst,
		IdempotencyTTL: cfg.APIIdempotencyTTL,
		Plan:           planOptions(cfg),
		// The placers' half-life: the queue view plans with the decayed
		// usage they order by.
		UsageHalfLife: cfg.PlacerUsageHalfLife,
		// The placers' run-time estimates: the queue view plans with the
		// owners' run times they plan with (holds, backfills, reasons).
		RuntimeEstimates: cfg.PlacerRuntimeEstimates,
		// The lifecycle controller (voyager placer) reads the same two
		// settings: they must agree, or extensions and runsUntil would
		// count from another limit than the one enforced.
		MaxRuntime:        cfg.MaxRuntime,
		MaxRuntimeCap:     cfg.MaxRuntimeCap,
		PowerDownAfter:    cfg.NodePowerDownAfter,
		MinCPUMilli:       cfg.MinCPUMilli,
		MinMemoryMiB:      cfg.MinMemoryMiB,
		AllowedRegistries: cfg.APIAllowedRegistries,
		MaxQueuedPerUser:  cfg.APIMaxQueuedPerUser,
		DefaultShmMiB:     cfg.DefaultShmMiB,
		UlimitNofile:      cfg.UlimitNofile,
		UlimitMemlockKiB:  cfg.MemlockKiB(),
		ExecAuditLog:      execAuditPath(cfg),
		Audit:             auditLog,
		Logger:            log,
	})
}

// openAuditLog opens the API's audit log (VOYAGER_API_AUDIT_LOG), or
// returns nil when it is off.
func openAuditLog(cfg config.Config, log *slog.Logger) (*audit.Log, error) {
	if cfg.APIAuditLog == "" || strings.EqualFold(cfg.APIAuditLog, "off") {
		log.Warn("no audit log: state-changing API calls are not recorded", "env", config.EnvAPIAuditLog)
		return nil, nil
	}
	l, err := audit.Open(audit.Options{Path: cfg.APIAuditLog, MaxBytes: cfg.APIAuditMaxMiB << 20, Keep: cfg.APIAuditKeep})
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, config.EnvAPIAuditLog)
	}
	log.Debug("audit log open", "path", l.Path())
	return l, nil
}

func closeAuditLog(l *audit.Log) {
	if l != nil {
		_ = l.Close()
	}
}

func apiComponent(a *api.API) component {
	return component{name: "api", run: a.Run}
}

// devAPISecret is the HS256 secret of `voyager dev`: the configured one;
// else, with the embedded etcd, one kept in the data directory; else (an
// external etcd, where dev keeps no local state) a random one for this run
// only, which `voyager token` cannot know.
func devAPISecret(cfg config.Config, embedded bool, log *slog.Logger) ([]byte, error) {
	if cfg.JWTSecret != "" || embedded {
		return devSecret(cfg, true)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("make token secret: %w", err)
	}
	log.Warn("no token secret configured: the API accepts no token minted elsewhere; set it to use voyager token", "env", config.EnvJWTSecret)
	return raw, nil
}

// devSecretFile holds the HS256 secret `voyager dev` generates when
// VOYAGER_JWT_SECRET is empty, so that `voyager token` can mint tokens
// for it without configuration.
const devSecretFile = "jwt-secret"

// devSecret returns the configured secret, else the one kept in the data
// directory, creating it (mode 0600) on first use when create is true.
func devSecret(cfg config.Config, create bool) ([]byte, error) {
	if cfg.JWTSecret != "" {
		return []byte(cfg.JWTSecret), nil
	}
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("find token secret: %s is empty and there is no data directory (set %s)", config.EnvJWTSecret, config.EnvDataDir)
	}
	path := filepath.Join(cfg.DataDir, devSecretFile)
	b, err := os.ReadFile(path)
	if err == nil {
		return []byte(strings.TrimSpace(string(b))), nil
	}
	if !errors.Is(err, fs.ErrNotExist) || !create {
		return nil, fmt.Errorf("read token secret %s (or set %s): %w", path, config.EnvJWTSecret, err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("make token secret: %w", err)
	}
	secret := base64.RawURLEncoding.EncodeToString(raw)
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory (%s): %w", config.EnvDataDir, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) { // another process made it first
			return devSecret(cfg, false)
		}
		return nil, fmt.Errorf("write token secret: %w", err)
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return nil, fmt.Errorf("write token secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("write token secret: %w", err)
	}
	return []byte(secret), nil
}

// execAuditPath is the API's exec audit file: VOYAGER_API_EXEC_AUDIT_LOG,
// by default <data dir>/audit/exec.jsonl; "-" is none (the API's log
// alone).
func execAuditPath(cfg config.Config) string {
	switch {
	case cfg.APIExecAuditLog == "-":
		return ""
	case cfg.APIExecAuditLog != "":
		return cfg.APIExecAuditLog
	case cfg.DataDir != "":
		return filepath.Join(cfg.DataDir, "audit", "exec.jsonl")
	}
	return ""
}
