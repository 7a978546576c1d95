package config

import (
	"errors"
	"github.com/spf13/pflag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// defaults is the Config that an environment with only HOME yields.
func defaults() Config {
	c := Config{
		EtcdPrefix:      "/voyager",
		EtcdDialTimeout: 5 * time.Second,
		DataDir:         "/home/u/.local/share/voyager",
		EtcdClientAddr:  "127.0.0.1:23790",
		EtcdPeerAddr:    "127.0.0.1:23800",
		EtcdCompaction:  time.Hour,
		EtcdQuotaMiB:    2048,
		HTTPAddr:        "127.0.0.1:7070",
		LogLevel:        "info",
		LogFormat:       "text",

		PlacerStrategy:         "binpack",
		PlacerReserveAfter:     10 * time.Minute,
		PlacerMaxTxnOps:        128,
		PlacerLeaseTTL:         10 * time.Second,
		PlacerRuntimeEstimates: true,
		MinCPUMilli:            100,
		MinMemoryMiB:           64,
		MaxSessionsPerNode:     256,

		JWTRolesClaim:     "roles",
		JWTGroupsClaim:    "groups",
		JWTAdminRole:      "admin",
		JWTServiceRole:    "service",
		APIMaxBodyBytes:   1 << 20,
		APIRate:           50,
		APIBurst:          100,
		APIIdempotencyTTL: 24 * time.Hour,

		AgentContainerd:  "/run/containerd/containerd.sock",
		AgentNamespace:   "voyager",
		AgentLeaseTTL:    10 * time.Second,
		AgentGPUMode:     "cdi",
		AgentMPSControl:  "nvidia-cuda-mps-control",
		AgentCDISpecDirs: []string{"/etc/cdi", "/var/run/cdi"},
		AgentImage:       "voyager.local/busybox:latest",
		AgentPorts:       "31000-31999",
		AgentStopGrace:   10 * time.Second,
		AgentUID:         1000,
		AgentGID:         100,
		AgentLogMaxMiB:   10,

		AgentNetwork:        "isolated",
		APIMaxQueuedPerUser: 100,
		APIAuditLog:         "/home/u/.local/share/voyager/audit/api.jsonl",
		APIAuditMaxMiB:      64,
		APIAuditKeep:        8,
		DefaultShmMiB:       8192,
		UlimitNofile:        1 << 20,
		UlimitMemlock:       "unlimited",
		AgentNetworkDeny:    []string{"169.254.0.0/16"},
		AgentJobRoutes:      "direct",
		AgentFenceKeeper:    "spawn",
		AgentCNIPluginDirs:  []string{"/usr/lib/cni", "/opt/cni/bin"},

		AgentActivityEvery:  30 * time.Second,
		AgentGPUBusyPercent: 10,
		AgentGPUUnusedAfter: 30 * time.Minute,
		IdleTimeout:         2 * time.Hour,
		StopWarning:         15 * time.Minute,
		StartTimeout:        5 * time.Minute,
		DrainDeadline:       time.Hour,
		NodePowerDownAfter:  30 * time.Minute,
		PreemptGrace:        2 * time.Minute,
		ElasticInterval:     5 * time.Minute,
		RestartBackoff:      10 * time.Second,
		RestartBackoffMax:   10 * time.Minute,

		Retention:            168 * time.Hour,
		RetentionAccrualWait: 24 * time.Hour,
		HistoryFile:          "/home/u/.local/share/voyager/history/sessions.jsonl",
	}
	c.AgentDenyControlPlane = true
	return c
}

func TestLoad(t *testing.T) {
	home := "HOME=/home/u"
	tests := []struct {
		name    string
		environ []string
		args    []string
		edit    func(*Config) // applied to defaults() to get the wanted Config
	}{
		{name: "defaults", environ: []string{home}},
		{
			name:    "xdg data home",
			environ: []string{home, "XDG_DATA_HOME=/xdg"},
			edit: func(c *Config) {
				c.DataDir = "/xdg/voyager"
				c.HistoryFile = "/xdg/voyager/history/sessions.jsonl"
				c.APIAuditLog = "/xdg/voyager/audit/api.jsonl"
			},
		},
		{
			name:    "relative xdg data home is ignored",
			environ: []string{home, "XDG_DATA_HOME=rel"},
		},
		{
			name:    "no home and no xdg leaves data dir empty",
			environ: nil,
			edit:    func(c *Config) { c.DataDir, c.HistoryFile, c.APIAuditLog = "", "", "" },
		},
		{
			name: "env overrides every default",
			environ: []string{
				home,
				"VOYAGER_ETCD_ENDPOINTS=http://a:2379, b:2379,,",
				"VOYAGER_ETCD_PREFIX=/v2/x",
				"VOYAGER_ETCD_DIAL_TIMEOUT=1m30s",
				"VOYAGER_DATA_DIR=/data/v",
				"VOYAGER_ETCD_CLIENT_ADDR=0.0.0.0:1",
				"VOYAGER_ETCD_PEER_ADDR=[::1]:2",
				"VOYAGER_ETCD_COMPACTION_RETENTION=10m",
				"VOYAGER_ETCD_QUOTA_MIB=8192",
				"VOYAGER_HTTP_ADDR=:8080",
				"VOYAGER_LOG_LEVEL=DEBUG",
				"VOYAGER_LOG_FORMAT=json",
				"VOYAGER_PLACER_STRATEGY=Spread",
				"VOYAGER_PLACER_RESERVE_AFTER=0",
				"VOYAGER_PLACER_MAX_TXN_OPS=1024",
				"VOYAGER_PLACER_LEASE_TTL=3s",
				"VOYAGER_PLACER_RUNTIME_ESTIMATES=false",
				"VOYAGER_JWT_SECRET=0123456789abcdef0123456789abcdef",
				"VOYAGER_JWT_PUBLIC_KEYS=/etc/voyager/jwks.json",
				"VOYAGER_JWT_AUDIENCE=voyager",
				"VOYAGER_JWT_ISSUER=https://idp",
				"VOYAGER_JWT_ROLES_CLAIM=realm_access.roles",
				"VOYAGER_JWT_GROUPS_CLAIM=grp",
				"VOYAGER_JWT_ADMIN_ROLE=ops",
				"VOYAGER_JWT_SERVICE_ROLE=hub",
				"VOYAGER_API_MAX_BODY_BYTES=4096",
				"VOYAGER_API_RATE=2.5",
				"VOYAGER_API_BURST=5",
				"VOYAGER_API_IDEMPOTENCY_TTL=1h",
				"VOYAGER_AGENT_NODE=gpu-07",
				"VOYAGER_AGENT_ADDRESS=10.0.0.7",
				"VOYAGER_AGENT_CONTAINERD=/run/c.sock",
				"VOYAGER_AGENT_NAMESPACE=v2",
				"VOYAGER_AGENT_LEASE_TTL=4s",
				"VOYAGER_AGENT_FENCE_AFTER=2s",
				"VOYAGER_AGENT_FENCE_GRACE=1s",
				"VOYAGER_AGENT_SIMULATE_GPUS=8xA100-80GB",
				"VOYAGER_AGENT_GPU_MODE=ENV",
				"VOYAGER_AGENT_CDI_SPEC_DIRS=/a, /b",
				"VOYAGER_AGENT_IMAGE=img:1",
				"VOYAGER_AGENT_PORTS=5000-5010",
				"VOYAGER_AGENT_STOP_GRACE=0s",
				"VOYAGER_AGENT_HOME_DIR=/homes",
				"VOYAGER_AGENT_UID=2000",
				"VOYAGER_AGENT_GID=2000",
				"VOYAGER_AGENT_LOG_MAX_MIB=1",
				"VOYAGER_RETENTION=1h",
				"VOYAGER_RETENTION_ACCRUAL_WAIT=2h",
				"VOYAGER_HISTORY_FILE=/var/lib/voyager/history.jsonl",
				"VOYAGER_AGENT_ACTIVITY_EVERY=1s",
				"VOYAGER_AGENT_GPU_BUSY_PERCENT=50",
				"VOYAGER_AGENT_GPU_UNUSED_AFTER=5m",
				"VOYAGER_IDLE_TIMEOUT=0",
				"VOYAGER_STOP_WARNING=1m",
				"VOYAGER_START_TIMEOUT=90s",
				"VOYAGER_MAX_RUNTIME=8h",
				"VOYAGER_MAX_RUNTIME_CAP=24h",
				"VOYAGER_DRAIN_DEADLINE=30m",
				"VOYAGER_NODE_POWER_DOWN_AFTER=2h",
				"VOYAGER_PREEMPT_GRACE=30s",
				"VOYAGER_ELASTIC_RESIZE_INTERVAL=2m",
				"VOYAGER_ELASTIC_RESIZE_NOTICE=10s",
				"VOYAGER_PREEMPT_NOTEBOOKS=true",
				"VOYAGER_RESTART_BACKOFF=1s",
				"VOYAGER_RESTART_BACKOFF_MAX=1m",
				"VOYAGER_MIN_CPU_MILLI=10",
				"VOYAGER_MIN_MEMORY_MIB=16",
				"VOYAGER_MAX_SESSIONS_PER_NODE=64",
				"VOYAGER_DEFAULT_SHM_MIB=2048",
				"VOYAGER_ULIMIT_NOFILE=65536",
				"VOYAGER_ULIMIT_MEMLOCK=65536",
				"VOYAGER_AGENT_JOB_ROUTES=Fabric",
				"VOYAGER_AGENT_NETWORK_DENY_CONTROL_PLANE=false",
			},
			edit: func(c *Config) {
				*c = Config{
					PlacerStrategy:       "spread",
					PlacerReserveAfter:   0,
					PlacerMaxTxnOps:      1024,
					PlacerLeaseTTL:       3 * time.Second,
					MinCPUMilli:          10,
					MinMemoryMiB:         16,
					MaxSessionsPerNode:   64,
					EtcdEndpoints:        []string{"http://a:2379", "b:2379"},
					EtcdPrefix:           "/v2/x",
					EtcdDialTimeout:      90 * time.Second,
					DataDir:              "/data/v",
					EtcdClientAddr:       "0.0.0.0:1",
					EtcdPeerAddr:         "[::1]:2",
					EtcdCompaction:       10 * time.Minute,
					EtcdQuotaMiB:         8192,
					AgentFenceAfter:      2 * time.Second,
					AgentFenceGrace:      time.Second,
					HTTPAddr:             ":8080",
					LogLevel:             "debug",
					LogFormat:            "json",
					JWTSecret:            "0123456789abcdef0123456789abcdef",
					JWTPublicKeys:        "/etc/voyager/jwks.json",
					JWTAudience:          "voyager",
					JWTIssuer:            "https://idp",
					JWTRolesClaim:        "realm_access.roles",
					JWTGroupsClaim:       "grp",
					JWTAdminRole:         "ops",
					JWTServiceRole:       "hub",
					APIMaxBodyBytes:      4096,
					APIRate:              2.5,
					APIBurst:             5,
					APIIdempotencyTTL:    time.Hour,
					AgentNode:            "gpu-07",
					AgentAddress:         "10.0.0.7",
					AgentContainerd:      "/run/c.sock",
					AgentNamespace:       "v2",
					AgentLeaseTTL:        4 * time.Second,
					AgentSimulateGPUs:    "8xA100-80GB",
					AgentMPSControl:      "nvidia-cuda-mps-control",
					AgentGPUMode:         "env",
					AgentCDISpecDirs:     []string{"/a", "/b"},
					AgentImage:           "img:1",
					AgentPorts:           "5000-5010",
					AgentStopGrace:       0,
					AgentHomeDir:         "/homes",
					AgentUID:             2000,
					AgentGID:             2000,
					AgentLogMaxMiB:       1,
					AgentNetwork:         "isolated",
					APIMaxQueuedPerUser:  100,
					APIAuditLog:          "/data/v/audit/api.jsonl",
					APIAuditMaxMiB:       64,
					APIAuditKeep:         8,
					DefaultShmMiB:        2048,
					UlimitNofile:         65536,
					UlimitMemlock:        "65536",
					AgentNetworkDeny:     []string{"169.254.0.0/16"},
					AgentJobRoutes:       "fabric",
					AgentFenceKeeper:     "spawn",
					AgentCNIPluginDirs:   []string{"/usr/lib/cni", "/opt/cni/bin"},
					Retention:            time.Hour,
					RetentionAccrualWait: 2 * time.Hour,
					HistoryFile:          "/var/lib/voyager/history.jsonl",
					AgentActivityEvery:   time.Second,
					AgentGPUBusyPercent:  50,
					AgentGPUUnusedAfter:  5 * time.Minute,
					StopWarning:          time.Minute,
					StartTimeout:         90 * time.Second,
					MaxRuntime:           8 * time.Hour,
					MaxRuntimeCap:        24 * time.Hour,
					DrainDeadline:        30 * time.Minute,
					NodePowerDownAfter:   2 * time.Hour,
					PreemptGrace:         30 * time.Second,
					PreemptNotebooks:     true,
					ElasticInterval:      2 * time.Minute,
					ElasticNotice:        10 * time.Second,
					RestartBackoff:       time.Second,
					RestartBackoffMax:    time.Minute,
				}
			},
		},
		{
			name:    "flag over env",
			environ: []string{home, "VOYAGER_HTTP_ADDR=127.0.0.1:1", "VOYAGER_LOG_LEVEL=warn"},
			args:    []string{"--http-addr", "127.0.0.1:2", "--etcd-endpoints=http://e:2379"},
			edit: func(c *Config) {
				c.HTTPAddr = "127.0.0.1:2"
				c.LogLevel = "warn"
				c.EtcdEndpoints = []string{"http://e:2379"}
			},
		},
		{
			name:    "explicit empty flag clears env",
			environ: []string{home, "VOYAGER_ETCD_ENDPOINTS=http://e:2379"},
			args:    []string{"--etcd-endpoints="},
		},
		{
			name:    "flag over invalid env",
			environ: []string{home, "VOYAGER_LOG_LEVEL=loud"},
			args:    []string{"--log-level=error"},
			edit:    func(c *Config) { c.LogLevel = "error" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			AddFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatalf("parse flags: %v", err)
			}
			got, err := Load(tt.environ, fs)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			want := defaults()
			if tt.edit != nil {
				tt.edit(&want)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Load:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestLoadInvalid(t *testing.T) {
	tests := []struct {
		name string
		env  string // KEY=value
		args []string
		want string // the whole message
	}{
		{
			name: "endpoints",
			env:  "VOYAGER_ETCD_ENDPOINTS=http://ok:2379,ftp://x",
			want: `invalid VOYAGER_ETCD_ENDPOINTS="http://ok:2379,ftp://x": want comma-separated etcd client URLs such as http://10.0.0.1:2379,http://10.0.0.2:2379 (scheme http or https, or host:port)`,
		},
		{
			name: "short jwt secret",
			env:  "VOYAGER_JWT_SECRET=short",
			want: `invalid VOYAGER_JWT_SECRET="(hidden)": want a secret of at least 32 bytes (for example: head -c 32 /dev/urandom | base64), or empty`,
		},
		{
			name: "service role equal to admin role",
			env:  "VOYAGER_JWT_SERVICE_ROLE=admin",
			want: `invalid VOYAGER_JWT_SERVICE_ROLE="admin": want a non-empty role name such as service, different from the admin role`,
		},
		{
			name: "agent ports",
			env:  "VOYAGER_AGENT_PORTS=40000",
			want: `invalid VOYAGER_AGENT_PORTS="40000": want a port range first-last within 1024-65535, such as 31000-31999`,
		},
		{
			name: "shm default",
			env:  "VOYAGER_DEFAULT_SHM_MIB=0",
			want: `invalid VOYAGER_DEFAULT_SHM_MIB="0": want a whole number of MiB of at least 1, such as 8192`,
		},
		{
			name: "nofile",
			env:  "VOYAGER_ULIMIT_NOFILE=100",
			want: `invalid VOYAGER_ULIMIT_NOFILE="100": want a whole number from 1024 to 1073741824 (and at most the nodes' fs.nr_open), such as 1048576`,
		},
		{
			name: "memlock",
			env:  "VOYAGER_ULIMIT_MEMLOCK=lots",
			want: `invalid VOYAGER_ULIMIT_MEMLOCK="lots": want unlimited, or a whole number of KiB of at least 64, such as 65536`,
		},
		{
			name: "agent gpu mode",
			env:  "VOYAGER_AGENT_GPU_MODE=docker",
			want: `invalid VOYAGER_AGENT_GPU_MODE="docker": want one of cdi, env`,
		},
		{
			name: "agent network",
			env:  "VOYAGER_AGENT_NETWORK=bridge",
			want: `invalid VOYAGER_AGENT_NETWORK="bridge": want one of isolated, host`,
		},
		{
			name: "agent job routes",
			env:  "VOYAGER_AGENT_JOB_ROUTES=bgp",
			want: `invalid VOYAGER_AGENT_JOB_ROUTES="bgp": want one of direct, fabric, off`,
		},
		{
			name: "agent network subnet",
			env:  "VOYAGER_AGENT_NETWORK_SUBNET=10.0.0.0",
			want: `invalid VOYAGER_AGENT_NETWORK_SUBNET="10.0.0.0": want an IPv4 CIDR such as 10.128.7.0/24, or empty`,
		},
		{
			name: "agent network deny",
			env:  "VOYAGER_AGENT_NETWORK_DENY=10.0.0.0/8,metadata",
			want: `invalid VOYAGER_AGENT_NETWORK_DENY="10.0.0.0/8,metadata": want comma-separated CIDRs such as 169.254.0.0/16,10.0.0.0/24`,
		},
		{
			name: "agent network allow",
			env:  "VOYAGER_AGENT_NETWORK_ALLOW=hub:8081",
			want: `invalid VOYAGER_AGENT_NETWORK_ALLOW="hub:8081": want comma-separated IPv4 ip:port endpoints such as 10.0.0.5:8081`,
		},
		{
			name: "allowed registries",
			env:  "VOYAGER_API_ALLOWED_REGISTRIES=docker.io/library",
			want: `invalid VOYAGER_API_ALLOWED_REGISTRIES="docker.io/library": want comma-separated registry hosts such as docker.io,registry.example.com:5000, or empty`,
		},
		{
			name: "agent node name",
			env:  "VOYAGER_AGENT_NODE=GPU_07!",
			want: `invalid VOYAGER_AGENT_NODE="GPU_07!": want 1-63 lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit, such as gpu-07`,
		},
		{
			name: "api rate",
			env:  "VOYAGER_API_RATE=0",
			want: `invalid VOYAGER_API_RATE="0": want a number of requests per second above 0, such as 50`,
		},
		{
			name: "idempotency ttl",
			env:  "VOYAGER_API_IDEMPOTENCY_TTL=1s",
			want: `invalid VOYAGER_API_IDEMPOTENCY_TTL="1s": want a duration of at least 1m, such as 24h`,
		},
		{
			name: "prefix without leading slash",
			env:  "VOYAGER_ETCD_PREFIX=voyager",
			want: `invalid VOYAGER_ETCD_PREFIX="voyager": want a key prefix of one or more /segments of letters, digits, ".", "_" or "-", with no trailing "/", such as /voyager`,
		},
		{
			name: "prefix with trailing slash",
			env:  "VOYAGER_ETCD_PREFIX=/voyager/",
			want: `invalid VOYAGER_ETCD_PREFIX="/voyager/": want a key prefix of one or more /segments of letters, digits, ".", "_" or "-", with no trailing "/", such as /voyager`,
		},
		{
			name: "prefix with space",
			env:  "VOYAGER_ETCD_PREFIX=/my voyager",
			want: `invalid VOYAGER_ETCD_PREFIX="/my voyager": want a key prefix of one or more /segments of letters, digits, ".", "_" or "-", with no trailing "/", such as /voyager`,
		},
		{
			name: "dial timeout unparsable",
			env:  "VOYAGER_ETCD_DIAL_TIMEOUT=5",
			want: `invalid VOYAGER_ETCD_DIAL_TIMEOUT="5": want a positive duration such as 5s, 500ms or 1m30s`,
		},
		{
			name: "dial timeout negative",
			env:  "VOYAGER_ETCD_DIAL_TIMEOUT=-1s",
			want: `invalid VOYAGER_ETCD_DIAL_TIMEOUT="-1s": want a positive duration such as 5s, 500ms or 1m30s`,
		},
		{
			name: "client addr",
			env:  "VOYAGER_ETCD_CLIENT_ADDR=localhost",
			want: `invalid VOYAGER_ETCD_CLIENT_ADDR="localhost": want host:port with a port from 1 to 65535, such as 127.0.0.1:7070`,
		},
		{
			name: "peer addr",
			env:  "VOYAGER_ETCD_PEER_ADDR=127.0.0.1:0",
			want: `invalid VOYAGER_ETCD_PEER_ADDR="127.0.0.1:0": want host:port with a port from 1 to 65535, such as 127.0.0.1:7070`,
		},
		{
			name: "http addr",
			env:  "VOYAGER_HTTP_ADDR=127.0.0.1:http",
			want: `invalid VOYAGER_HTTP_ADDR="127.0.0.1:http": want host:port with a port from 1 to 65535, such as 127.0.0.1:7070`,
		},
		{
			name: "log level",
			env:  "VOYAGER_LOG_LEVEL=trace",
			want: `invalid VOYAGER_LOG_LEVEL="trace": want one of debug, info, warn, error`,
		},
		{
			name: "log format",
			env:  "VOYAGER_LOG_FORMAT=logfmt",
			want: `invalid VOYAGER_LOG_FORMAT="logfmt": want one of text, json`,
		},
		{
			name: "placer strategy",
			env:  "VOYAGER_PLACER_STRATEGY=random",
			want: `invalid VOYAGER_PLACER_STRATEGY="random": want one of binpack, spread, pack`,
		},
		{
			name: "negative reserve after",
			env:  "VOYAGER_PLACER_RESERVE_AFTER=-1m",
			want: `invalid VOYAGER_PLACER_RESERVE_AFTER="-1m": want a duration of 0 or more, such as 10m (0 turns reservations off)`,
		},
		{
			name: "tiny txn",
			env:  "VOYAGER_PLACER_MAX_TXN_OPS=4",
			want: `invalid VOYAGER_PLACER_MAX_TXN_OPS="4": want a whole number from 8 up to etcd's --max-txn-ops (default 128)`,
		},
		{
			name: "sub-second placer lease",
			env:  "VOYAGER_PLACER_LEASE_TTL=500ms",
			want: `invalid VOYAGER_PLACER_LEASE_TTL="500ms": want a duration of at least 1s, such as 10s`,
		},
		{
			name: "fence past the lease",
			env:  "VOYAGER_AGENT_FENCE_AFTER=9s",
			want: `invalid VOYAGER_AGENT_FENCE_AFTER="9s": want a duration of 0 or more, such that it plus VOYAGER_AGENT_FENCE_GRACE is less than VOYAGER_AGENT_LEASE_TTL, such as 5s (0: half the lease TTL)`,
		},
		{
			name: "tiny etcd quota",
			env:  "VOYAGER_ETCD_QUOTA_MIB=1",
			want: `invalid VOYAGER_ETCD_QUOTA_MIB="1": want a whole number of MiB from 16 to 8192, such as 2048`,
		},
		{
			name: "retention too short",
			env:  "VOYAGER_RETENTION=10s",
			want: `invalid VOYAGER_RETENTION="10s": want a duration of at least 1m, such as 168h (7 days)`,
		},
		{
			name: "accrual wait too short",
			env:  "VOYAGER_RETENTION_ACCRUAL_WAIT=0s",
			want: `invalid VOYAGER_RETENTION_ACCRUAL_WAIT="0s": want a duration of at least 1m, such as 24h`,
		},
		{
			name: "bad flag names the flag and the variable",
			args: []string{"--etcd-dial-timeout=soon"},
			want: `invalid --etcd-dial-timeout="soon" (flag for VOYAGER_ETCD_DIAL_TIMEOUT): want a positive duration such as 5s, 500ms or 1m30s`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			AddFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatalf("parse flags: %v", err)
			}
			environ := []string{"HOME=/home/u"}
			if tt.env != "" {
				environ = append(environ, tt.env)
			}
			_, err := Load(environ, fs)
			if err == nil {
				t.Fatal("Load: no error")
			}
			if err.Error() != tt.want {
				t.Errorf("Load error:\n got %s\nwant %s", err, tt.want)
			}
			var ie *InvalidError
			if !errors.As(err, &ie) {
				t.Errorf("Load error %T is not an *InvalidError", err)
			}
		})
	}
}

func TestLoadReportsEveryInvalidValue(t *testing.T) {
	_, err := Load([]string{"VOYAGER_LOG_LEVEL=x", "VOYAGER_LOG_FORMAT=y", "VOYAGER_ETCD_PREFIX=z"}, nil)
	if err == nil {
		t.Fatal("Load: no error")
	}
	for _, v := range []string{EnvLogLevel, EnvLogFormat, EnvEtcdPrefix} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("error %q does not name %s", err, v)
		}
	}
}

func TestRequireEndpoints(t *testing.T) {
	cfg, err := Load([]string{"HOME=/h"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.RequireEndpoints()
	if err == nil || !strings.Contains(err.Error(), EnvEtcdEndpoints) {
		t.Fatalf("RequireEndpoints = %v, want an error naming %s", err, EnvEtcdEndpoints)
	}
	cfg.EtcdEndpoints = []string{"http://e:2379"}
	if err := cfg.RequireEndpoints(); err != nil {
		t.Fatalf("RequireEndpoints with endpoints = %v", err)
	}
}

func TestFlagsAndHelpCoverEverySetting(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	AddFlags(fs)
	var help strings.Builder
	WriteEnvHelp(&help)
	for _, s := range Settings() {
		if fs.Lookup(s.Flag) == nil {
			t.Errorf("no flag --%s for %s", s.Flag, s.Env)
		}
		if !strings.Contains(help.String(), s.Env) || !strings.Contains(help.String(), "default: "+s.Default) {
			t.Errorf("env help lacks %s with default %q:\n%s", s.Env, s.Default, help.String())
		}
		if s.Doc == "" {
			t.Errorf("%s has no doc tag", s.Env)
		}
	}
}

func TestAddFlagsSubset(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	AddFlags(fs, EnvHTTPAddr, EnvLogLevel)
	var n int
	fs.VisitAll(func(*pflag.Flag) { n++ })
	if n != 2 || fs.Lookup("http-addr") == nil || fs.Lookup("log-level") == nil {
		t.Errorf("AddFlags subset registered %d flags, want http-addr and log-level", n)
	}
}
