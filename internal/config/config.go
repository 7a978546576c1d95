package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/spf13/pflag"

	"github.com/voyager-gpu/voyager/state"
)

// Names of the environment variables. Other packages use these to tell the
// user which variable changes a behaviour.
const (
	EnvEtcdEndpoints   = "VOYAGER_ETCD_ENDPOINTS"
	EnvEtcdPrefix      = "VOYAGER_ETCD_PREFIX"
	EnvEtcdDialTimeout = "VOYAGER_ETCD_DIAL_TIMEOUT"
	EnvEtcdCA          = "VOYAGER_ETCD_CA"
	EnvEtcdCert        = "VOYAGER_ETCD_CERT"
	EnvEtcdKey         = "VOYAGER_ETCD_KEY"
	EnvEtcdServerName  = "VOYAGER_ETCD_SERVER_NAME"
	EnvEtcdUser        = "VOYAGER_ETCD_USER"
	EnvEtcdPassword    = "VOYAGER_ETCD_PASSWORD_FILE"
	EnvHTTPTLSCert     = "VOYAGER_HTTP_TLS_CERT"
	EnvHTTPTLSKey      = "VOYAGER_HTTP_TLS_KEY"
	EnvHTTPClientCA    = "VOYAGER_HTTP_CLIENT_CA"
	EnvHTTPPlain       = "VOYAGER_HTTP_PLAIN"
	EnvDataDir         = "VOYAGER_DATA_DIR"
	EnvEtcdClientAddr  = "VOYAGER_ETCD_CLIENT_ADDR"
	EnvEtcdPeerAddr    = "VOYAGER_ETCD_PEER_ADDR"
	EnvEtcdCompaction  = "VOYAGER_ETCD_COMPACTION_RETENTION"
	EnvEtcdQuotaMiB    = "VOYAGER_ETCD_QUOTA_MIB"
	EnvHTTPAddr        = "VOYAGER_HTTP_ADDR"
	EnvLogLevel        = "VOYAGER_LOG_LEVEL"
	EnvLogFormat       = "VOYAGER_LOG_FORMAT"

	EnvPlacerStrategy     = "VOYAGER_PLACER_STRATEGY"
	EnvPlacerReserveAfter = "VOYAGER_PLACER_RESERVE_AFTER"
	EnvPlacerMaxTxnOps    = "VOYAGER_PLACER_MAX_TXN_OPS"
	EnvPlacerLeaseTTL     = "VOYAGER_PLACER_LEASE_TTL"
	EnvPlacerShortFirst   = "VOYAGER_PLACER_SHORT_FIRST"

	EnvPlacerUsageHalfLife = "VOYAGER_PLACER_USAGE_HALF_LIFE"
	// EnvPlacerRuntimeEstimates turns the placer's run-time estimates
	// (runtimes/) on or off.
	EnvPlacerRuntimeEstimates = "VOYAGER_PLACER_RUNTIME_ESTIMATES"

	EnvMinCPUMilli        = "VOYAGER_MIN_CPU_MILLI"
	EnvMinMemoryMiB       = "VOYAGER_MIN_MEMORY_MIB"
	EnvMaxSessionsPerNode = "VOYAGER_MAX_SESSIONS_PER_NODE"

	EnvJWTSecret         = "VOYAGER_JWT_SECRET"
	EnvJWTPublicKeys     = "VOYAGER_JWT_PUBLIC_KEYS"
	EnvJWTAudience       = "VOYAGER_JWT_AUDIENCE"
	EnvJWTIssuer         = "VOYAGER_JWT_ISSUER"
	EnvJWTRolesClaim     = "VOYAGER_JWT_ROLES_CLAIM"
	EnvJWTGroupsClaim    = "VOYAGER_JWT_GROUPS_CLAIM"
	EnvJWTAdminRole      = "VOYAGER_JWT_ADMIN_ROLE"
	EnvJWTServiceRole    = "VOYAGER_JWT_SERVICE_ROLE"
	EnvAPIMaxBodyBytes   = "VOYAGER_API_MAX_BODY_BYTES"
	EnvAPIRate           = "VOYAGER_API_RATE"
	EnvAPIBurst          = "VOYAGER_API_BURST"
	EnvAPIIdempotencyTTL = "VOYAGER_API_IDEMPOTENCY_TTL"
	EnvAPIRegistries     = "VOYAGER_API_ALLOWED_REGISTRIES"
	EnvAPIMaxQueued      = "VOYAGER_API_MAX_QUEUED_PER_USER"
	EnvAPIExecAuditLog   = "VOYAGER_API_EXEC_AUDIT_LOG"
	EnvAPIAuditLog       = "VOYAGER_API_AUDIT_LOG"
	EnvAPIAuditMaxMiB    = "VOYAGER_API_AUDIT_MAX_MIB"
	EnvAPIAuditKeep      = "VOYAGER_API_AUDIT_KEEP"
	EnvDefaultShmMiB     = "VOYAGER_DEFAULT_SHM_MIB"
	EnvUlimitNofile      = "VOYAGER_ULIMIT_NOFILE"
	EnvUlimitMemlock     = "VOYAGER_ULIMIT_MEMLOCK"
)

// Names of the node agent's variables.
const (
	EnvAgentNode         = "VOYAGER_AGENT_NODE"
	EnvAgentAddress      = "VOYAGER_AGENT_ADDRESS"
	EnvAgentContainerd   = "VOYAGER_AGENT_CONTAINERD"
	EnvAgentNamespace    = "VOYAGER_AGENT_NAMESPACE"
	EnvAgentLeaseTTL     = "VOYAGER_AGENT_LEASE_TTL"
	EnvAgentFenceAfter   = "VOYAGER_AGENT_FENCE_AFTER"
	EnvAgentFenceGrace   = "VOYAGER_AGENT_FENCE_GRACE"
	EnvAgentSimulateGPUs = "VOYAGER_AGENT_SIMULATE_GPUS"
	EnvAgentSharedGPUs   = "VOYAGER_AGENT_SHARED_GPUS"
	EnvAgentGPUMode      = "VOYAGER_AGENT_GPU_MODE"
	EnvAgentCDISpecDirs  = "VOYAGER_AGENT_CDI_SPEC_DIRS"
	EnvAgentImage        = "VOYAGER_AGENT_IMAGE"
	EnvAgentPorts        = "VOYAGER_AGENT_PORTS"
	EnvAgentStopGrace    = "VOYAGER_AGENT_STOP_GRACE"
	EnvAgentHomeDir      = "VOYAGER_AGENT_HOME_DIR"
	EnvAgentUID          = "VOYAGER_AGENT_UID"
	EnvAgentGID          = "VOYAGER_AGENT_GID"
	EnvAgentLogMaxMiB    = "VOYAGER_AGENT_LOG_MAX_MIB"

	EnvAgentNetwork       = "VOYAGER_AGENT_NETWORK"
	EnvAgentNetworkName   = "VOYAGER_AGENT_NETWORK_NAME"
	EnvAgentNetworkSubnet = "VOYAGER_AGENT_NETWORK_SUBNET"
	EnvAgentNetworkDeny   = "VOYAGER_AGENT_NETWORK_DENY"
	EnvAgentNetworkAllow  = "VOYAGER_AGENT_NETWORK_ALLOW"
	EnvAgentDenyControl   = "VOYAGER_AGENT_NETWORK_DENY_CONTROL_PLANE"
	EnvAgentJobRoutes     = "VOYAGER_AGENT_JOB_ROUTES"
	EnvAgentFenceKeeper   = "VOYAGER_AGENT_FENCE_KEEPER"
	EnvAgentCNIPluginDirs = "VOYAGER_AGENT_CNI_PLUGIN_DIRS"

	EnvAgentActivityEvery  = "VOYAGER_AGENT_ACTIVITY_EVERY"
	EnvAgentGPUBusyPercent = "VOYAGER_AGENT_GPU_BUSY_PERCENT"
	EnvAgentGPUUnusedAfter = "VOYAGER_AGENT_GPU_UNUSED_AFTER"

	EnvRetention   = "VOYAGER_RETENTION"
	EnvHistoryFile = "VOYAGER_HISTORY_FILE"
	// EnvRetentionAccrualWait bounds how long retention waits for the
	// usage accountant.
	EnvRetentionAccrualWait = "VOYAGER_RETENTION_ACCRUAL_WAIT"

	EnvIdleTimeout        = "VOYAGER_IDLE_TIMEOUT"
	EnvStopWarning        = "VOYAGER_STOP_WARNING"
	EnvMaxRuntime         = "VOYAGER_MAX_RUNTIME"
	EnvStartTimeout       = "VOYAGER_START_TIMEOUT"
	EnvMaxRuntimeCap      = "VOYAGER_MAX_RUNTIME_CAP"
	EnvDrainDeadline      = "VOYAGER_DRAIN_DEADLINE"
	EnvNodePowerDownAfter = "VOYAGER_NODE_POWER_DOWN_AFTER"
	EnvPreemptGrace       = "VOYAGER_PREEMPT_GRACE"
	EnvPreemptNotebooks   = "VOYAGER_PREEMPT_NOTEBOOKS"
	EnvRestartBackoff     = "VOYAGER_RESTART_BACKOFF"
	EnvRestartBackoffMax  = "VOYAGER_RESTART_BACKOFF_MAX"
	EnvElasticInterval    = "VOYAGER_ELASTIC_RESIZE_INTERVAL"
	EnvElasticNotice      = "VOYAGER_ELASTIC_RESIZE_NOTICE"
	EnvPlacerGoodput      = "VOYAGER_PLACER_GOODPUT"
)

// Config holds the settings of one voyager process. Load fills it from the
// environment and flags and validates it; the zero value is not useful.
//
// Tags: env names the variable, envDefault its default, docDefault the
// documented default where Load computes it, doc its meaning. README.md's
// configuration table is checked against these tags by a test.
type Config struct {
	// EtcdEndpoints are the client URLs of an external etcd cluster. Empty
	// means `voyager dev` runs an embedded etcd; every other subcommand
	// needs them (see RequireEndpoints).
	EtcdEndpoints []string `env:"VOYAGER_ETCD_ENDPOINTS" envSeparator:"," docDefault:"empty" doc:"comma-separated etcd client URLs (http://host:2379,…); empty: voyager dev runs an embedded etcd, other subcommands require it"`
	// EtcdPrefix is the key prefix under which all of Voyager's keys live.
	EtcdPrefix string `env:"VOYAGER_ETCD_PREFIX" envDefault:"/voyager" doc:"etcd key prefix of all Voyager keys: /segments of letters, digits, '.', '_' or '-', no trailing /"`
	// EtcdDialTimeout bounds connecting to etcd.
	EtcdDialTimeout time.Duration `env:"VOYAGER_ETCD_DIAL_TIMEOUT" envDefault:"5s" doc:"how long to wait for etcd to answer when connecting"`
	// EtcdCA is a PEM file of the CA that signs etcd's serving
	// certificates; set, the client speaks TLS to every endpoint.
	EtcdCA string `env:"VOYAGER_ETCD_CA" docDefault:"empty" doc:"PEM file of the CA that signed the etcd members' certificates; set (or any https:// endpoint): every etcd connection uses TLS and verifies the members against it"`
	// EtcdCert and EtcdKey are this process's client certificate and key.
	EtcdCert string `env:"VOYAGER_ETCD_CERT" docDefault:"empty" doc:"PEM file of this process's etcd client certificate (with VOYAGER_ETCD_KEY); with etcd's --client-cert-auth its CN is the etcd user when VOYAGER_ETCD_USER is empty"`
	// EtcdKey is the private key of EtcdCert.
	EtcdKey string `env:"VOYAGER_ETCD_KEY" docDefault:"empty" doc:"PEM file of the private key of VOYAGER_ETCD_CERT"`
	// EtcdServerName overrides the name the members' certificates are
	// checked against (default: each endpoint's host).
	EtcdServerName string `env:"VOYAGER_ETCD_SERVER_NAME" docDefault:"each endpoint's host" doc:"name the etcd members' certificates must carry, when the endpoints' hosts are not in them (e.g. IPs behind a name)"`
	// EtcdUser is the etcd user to authenticate as with a password.
	EtcdUser string `env:"VOYAGER_ETCD_USER" docDefault:"empty" doc:"etcd user to log in as with the password in VOYAGER_ETCD_PASSWORD_FILE; empty: the client certificate's CN is the user (or etcd auth is off)"`
	// EtcdPasswordFile holds EtcdUser's password, so that it is never in
	// the environment or on a command line.
	EtcdPasswordFile string `env:"VOYAGER_ETCD_PASSWORD_FILE" docDefault:"empty" doc:"file holding VOYAGER_ETCD_USER's password (first line); required when VOYAGER_ETCD_USER is set"`
	// DataDir holds local state; the embedded etcd lives in DataDir/etcd.
	// Load sets it to $XDG_DATA_HOME/voyager, else ~/.local/share/voyager,
	// and leaves it empty only if neither XDG_DATA_HOME nor HOME is set.
	DataDir string `env:"VOYAGER_DATA_DIR" docDefault:"$XDG_DATA_HOME/voyager, else ~/.local/share/voyager" doc:"local state; the embedded etcd keeps its data in <data dir>/etcd across runs"`
	// EtcdClientAddr is where the embedded etcd serves clients.
	EtcdClientAddr string `env:"VOYAGER_ETCD_CLIENT_ADDR" envDefault:"127.0.0.1:23790" doc:"client listener of the embedded etcd (voyager dev only)"`
	// EtcdPeerAddr is the embedded etcd's raft peer listener.
	EtcdPeerAddr string `env:"VOYAGER_ETCD_PEER_ADDR" envDefault:"127.0.0.1:23800" doc:"peer listener of the embedded etcd (voyager dev only)"`
	// EtcdCompaction is the embedded etcd's periodic auto-compaction
	// retention: history older than this is compacted away.
	EtcdCompaction time.Duration `env:"VOYAGER_ETCD_COMPACTION_RETENTION" envDefault:"1h" doc:"history the embedded etcd keeps: it compacts revisions older than this, periodically (voyager dev only; 0 turns compaction off)"`
	// EtcdQuotaMiB is the embedded etcd's backend quota.
	EtcdQuotaMiB int64 `env:"VOYAGER_ETCD_QUOTA_MIB" envDefault:"2048" doc:"space quota of the embedded etcd's database in MiB; past it etcd raises a NOSPACE alarm and refuses writes (voyager dev only)"`
	// HTTPAddr is where the HTTP server (health, readiness, metrics, API)
	// listens.
	HTTPAddr string `env:"VOYAGER_HTTP_ADDR" envDefault:"127.0.0.1:7070" doc:"HTTP listener: /healthz, /readyz, /metrics and the API"`
	// HTTPTLSCert and HTTPTLSKey make the HTTP listener serve HTTPS.
	HTTPTLSCert string `env:"VOYAGER_HTTP_TLS_CERT" docDefault:"empty" doc:"PEM certificate (chain) of the HTTP listener; with VOYAGER_HTTP_TLS_KEY it serves HTTPS only"`
	// HTTPTLSKey is the private key of HTTPTLSCert.
	HTTPTLSKey string `env:"VOYAGER_HTTP_TLS_KEY" docDefault:"empty" doc:"PEM private key of VOYAGER_HTTP_TLS_CERT"`
	// HTTPClientCA, when set, makes the HTTPS listener require client
	// certificates signed by it.
	HTTPClientCA string `env:"VOYAGER_HTTP_CLIENT_CA" docDefault:"empty" doc:"PEM CA file: the HTTPS listener requires client certificates it signed (e.g. the agent's log endpoint behind the API); empty: no client certificates"`
	// HTTPPlain allows plain HTTP on a non-loopback address.
	HTTPPlain bool `env:"VOYAGER_HTTP_PLAIN" envDefault:"false" doc:"allow plain HTTP on a non-loopback VOYAGER_HTTP_ADDR (only behind a TLS-terminating proxy on a trusted network); voyager api refuses it otherwise"`
	// LogLevel is one of debug, info, warn, error.
	LogLevel string `env:"VOYAGER_LOG_LEVEL" envDefault:"info" doc:"log level: debug, info, warn or error"`
	// LogFormat is text or json.
	LogFormat string `env:"VOYAGER_LOG_FORMAT" envDefault:"text" doc:"log format: text or json"`

	// PlacerStrategy is binpack, spread or pack.
	PlacerStrategy string `env:"VOYAGER_PLACER_STRATEGY" envDefault:"binpack" doc:"placement strategy: binpack (keep whole machines free), spread (the emptiest node; while 4- or 8-GPU requests arrive, half and whole machines kept free, and while the queue asks for more GPUs than are free, the fullest node as binpack), or pack (new work on the fewest machines, beside sessions that run longest, so that the rest empty and may be powered down)"`
	// PlacerReserveAfter is how long a request waits before it holds capacity.
	PlacerReserveAfter time.Duration `env:"VOYAGER_PLACER_RESERVE_AFTER" envDefault:"10m" doc:"a 1-GPU request pending this long that fits no node in use holds the nodes closest to fitting it (a request of g GPUs after this over g; each owner up to what its fair share exceeds its holding by), and the lead time of the standing reserve of whole machines; it also turns on lending only short work to owners at or above their fair share while an owner below theirs waits; 0 turns holds, the reserve and lending off"`
	// PlacerShortFirst orders each owner's requests shortest declared max
	// runtime first, aged (placer.PlanOptions.ShortFirst).
	PlacerShortFirst bool `env:"VOYAGER_PLACER_SHORT_FIRST" envDefault:"false" doc:"order each owner's own pending requests by arrival plus declared max runtime (shortest first, aged; none counts as 72h) instead of oldest first; owners still go by fair share"`
	// PlacerMaxTxnOps caps operations per bind transaction.
	PlacerMaxTxnOps int `env:"VOYAGER_PLACER_MAX_TXN_OPS" envDefault:"128" doc:"operations per bind transaction; at most etcd's --max-txn-ops"`
	// PlacerLeaseTTL is the TTL of a placer's membership lease.
	PlacerLeaseTTL time.Duration `env:"VOYAGER_PLACER_LEASE_TTL" envDefault:"10s" doc:"TTL of a placer's membership lease; a dead placer's nodes pass to the others after it"`
	// PlacerUsageHalfLife is the half-life of the past GPU-hours that
	// count in a team's fair share; 0: they do not.
	PlacerUsageHalfLife time.Duration `env:"VOYAGER_PLACER_USAGE_HALF_LIFE" envDefault:"0s" doc:"half-life of the GPU-hours teams used (gpuhours/, the usage accountant's daily records): with it, a team's decayed usage as a share of every team's adds to its share beyond its guarantee in the queue order, so a team that used much lately waits behind one that did not; 0 keeps the order to what teams hold now; the API reads it too, so that its queue view plans with the same decayed usage"`
	// PlacerRuntimeEstimates makes the placer estimate when sessions end
	// from their owners' recent run times (placer.Config.RuntimeEstimates),
	// and the API's queue view plan with them as the placer does
	// (api.Config.RuntimeEstimates).
	PlacerRuntimeEstimates bool `env:"VOYAGER_PLACER_RUNTIME_ESTIMATES" envDefault:"true" doc:"where an owner's last finished sessions of a size all declared a max runtime several times what they ran and took about as long as each other, expect the next of that size to end by the longest of them (runtimes/, learned by the usage accountant), never later than its max runtime, when planning which nodes empty soon (holds, drains); false: by max runtimes alone; the API reads it too, so that its queue view plans with the same run times"`
	// MinCPUMilli is the least CPU a session (and each Ray worker) may ask
	// for; with MaxSessionsPerNode it bounds a node's ledger.
	MinCPUMilli int64 `env:"VOYAGER_MIN_CPU_MILLI" envDefault:"100" doc:"least cpuMilli a session or Ray worker may ask for; smaller requests are refused at admission"`
	// MinMemoryMiB is the least memory a session (and each worker) may ask for.
	MinMemoryMiB int64 `env:"VOYAGER_MIN_MEMORY_MIB" envDefault:"64" doc:"least memoryMiB a session or Ray worker may ask for; smaller requests are refused at admission"`
	// MaxSessionsPerNode caps the sessions one node holds, so that its
	// ledger (one etcd value) stays far below etcd's request limit.
	MaxSessionsPerNode int `env:"VOYAGER_MAX_SESSIONS_PER_NODE" envDefault:"256" doc:"most sessions (and Ray workers) one node holds at once; keeps the node's ledger, one etcd value, far below etcd's 1.5 MiB request limit"`

	// The HTTP API (voyager api, voyager dev) and its JWT verification.

	// JWTSecret is the HS256 secret; it also lets `voyager token` mint
	// tokens. Empty in `voyager dev` means a secret kept in DataDir.
	JWTSecret string `env:"VOYAGER_JWT_SECRET" docDefault:"empty" doc:"HS256 secret that signs API tokens (at least 32 bytes); empty: voyager dev keeps a random one in <data dir>/jwt-secret"`
	// JWTPublicKeys is a PEM file of RSA or P-256 ECDSA public keys, or a
	// JWKS file, that verify RS256 and ES256 tokens.
	JWTPublicKeys string `env:"VOYAGER_JWT_PUBLIC_KEYS" docDefault:"empty" doc:"path of a PEM file (RSA or EC P-256 public keys) or a JWKS file (JSON) that verifies RS256/ES256 tokens"`
	// JWTAudience, when set, must be in a token's aud claim.
	JWTAudience string `env:"VOYAGER_JWT_AUDIENCE" docDefault:"empty" doc:"required aud claim of tokens; empty: not checked"`
	// JWTIssuer, when set, must equal a token's iss claim.
	JWTIssuer string `env:"VOYAGER_JWT_ISSUER" docDefault:"empty" doc:"required iss claim of tokens; empty: not checked"`
	// JWTRolesClaim names the claim holding roles; dots walk into objects.
	JWTRolesClaim string `env:"VOYAGER_JWT_ROLES_CLAIM" envDefault:"roles" doc:"claim with the token's roles (a list or a space-separated string); dots walk into objects, e.g. realm_access.roles"`
	// JWTGroupsClaim names the claim holding groups.
	JWTGroupsClaim string `env:"VOYAGER_JWT_GROUPS_CLAIM" envDefault:"groups" doc:"claim with the token's groups (for group quotas); dots walk into objects"`
	// JWTAdminRole is the role that may see everything and administer.
	JWTAdminRole string `env:"VOYAGER_JWT_ADMIN_ROLE" envDefault:"admin" doc:"role that sees every session and may cordon, drain and edit profiles and quotas"`
	// JWTServiceRole is the role (JupyterHub's) that acts on behalf of users.
	JWTServiceRole string `env:"VOYAGER_JWT_SERVICE_ROLE" envDefault:"service" doc:"role that may act on behalf of a user named in X-Voyager-On-Behalf-Of, and do nothing else"`
	// APIMaxBodyBytes caps request bodies.
	APIMaxBodyBytes int64 `env:"VOYAGER_API_MAX_BODY_BYTES" envDefault:"1048576" doc:"largest request body the API reads, in bytes"`
	// APIRate is the sustained requests per second allowed per subject.
	APIRate float64 `env:"VOYAGER_API_RATE" envDefault:"50" doc:"requests per second allowed per token subject (sustained)"`
	// APIBurst is the burst allowed per subject above APIRate.
	APIBurst int `env:"VOYAGER_API_BURST" envDefault:"100" doc:"requests per token subject allowed in a burst"`
	// APIIdempotencyTTL is how long an Idempotency-Key is remembered.
	APIIdempotencyTTL time.Duration `env:"VOYAGER_API_IDEMPOTENCY_TTL" envDefault:"24h" doc:"how long a create's Idempotency-Key is remembered"`
	// APIAllowedRegistries are the registries session images may name.
	APIAllowedRegistries []string `env:"VOYAGER_API_ALLOWED_REGISTRIES" envSeparator:"," docDefault:"empty" doc:"comma-separated registries session images may come from (docker.io, registry.example.com:5000); empty: any"`
	// APIMaxQueuedPerUser caps one user's queued sessions.
	APIMaxQueuedPerUser int `env:"VOYAGER_API_MAX_QUEUED_PER_USER" envDefault:"100" doc:"most sessions one user may have queued at once; a create beyond it is refused; 0: no cap"`
	// APIExecAuditLog is the exec audit log's file ("-": the log only).
	APIExecAuditLog string `env:"VOYAGER_API_EXEC_AUDIT_LOG" docDefault:"<data dir>/audit/exec.jsonl" doc:"file (JSON lines, appended, mode 0600) recording every exec and port-forward into a session: who, when, which session, what command or port, how it ended; an exec whose record cannot be written is refused; -: the API's log only"`
	// APIAuditLog is the API's audit log; Load sets it to
	// DataDir/audit/api.jsonl when empty. "off": none.
	APIAuditLog string `env:"VOYAGER_API_AUDIT_LOG" docDefault:"<data dir>/audit/api.jsonl" doc:"append-only audit log of every state-changing API call (who, on behalf of whom, what, outcome), one JSON record a line, on the API's machine; off: none"`
	// APIAuditMaxMiB is the size past which the audit log rotates.
	APIAuditMaxMiB int64 `env:"VOYAGER_API_AUDIT_MAX_MIB" envDefault:"64" doc:"size in MiB past which the audit log is rotated (to <file>.1, .2, …)"`
	// APIAuditKeep is how many rotated audit logs are kept.
	APIAuditKeep int `env:"VOYAGER_API_AUDIT_KEEP" envDefault:"8" doc:"how many rotated audit logs are kept; older ones are deleted"`
	// DefaultShmMiB sizes /dev/shm of sessions that name no shmMiB.
	DefaultShmMiB int64 `env:"VOYAGER_DEFAULT_SHM_MIB" envDefault:"8192" doc:"/dev/shm of a session that names no shmMiB, in MiB, at most half its memoryMiB (shm pages count against the session's memory): room for PyTorch DataLoader workers, which pass batches through /dev/shm"`
	// UlimitNofile is the open-file limit sessions get and the most they
	// may ask for.
	UlimitNofile int64 `env:"VOYAGER_ULIMIT_NOFILE" envDefault:"1048576" doc:"open-file limit (ulimit -n, soft and hard) of session processes, and the most a session may ask for (NCCL and data loaders open many); at most the nodes' fs.nr_open"`
	// UlimitMemlock is the locked-memory limit sessions get and the most
	// they may ask for: "unlimited" or KiB.
	UlimitMemlock string `env:"VOYAGER_ULIMIT_MEMLOCK" envDefault:"unlimited" doc:"locked-memory limit (ulimit -l, soft and hard) of session processes, and the most a session may ask for: unlimited (what RDMA and NCCL's pinned buffers need) or a whole number of KiB"`

	// The node agent (voyager agent, and the agent inside voyager dev).

	// AgentNode is this machine's node name; empty means the host name.
	AgentNode string `env:"VOYAGER_AGENT_NODE" docDefault:"the host name" doc:"this machine's node name (1-63 lower-case letters, digits, '.', '_' or '-')"`
	// AgentAddress is how users and other nodes reach this machine.
	AgentAddress string `env:"VOYAGER_AGENT_ADDRESS" docDefault:"the node name" doc:"host name or IP at which users and other nodes reach this machine (in session URLs, for Ray workers)"`
	// AgentContainerd is containerd's socket.
	AgentContainerd string `env:"VOYAGER_AGENT_CONTAINERD" envDefault:"/run/containerd/containerd.sock" doc:"containerd's socket; voyager dev starts a private containerd under <data dir>/containerd when none answers there and it runs as root"`
	// AgentNamespace is the containerd namespace of session containers.
	AgentNamespace string `env:"VOYAGER_AGENT_NAMESPACE" envDefault:"voyager" doc:"containerd namespace of session containers"`
	// AgentLeaseTTL is the TTL of the node's lease.
	AgentLeaseTTL time.Duration `env:"VOYAGER_AGENT_LEASE_TTL" envDefault:"10s" doc:"TTL of the node's lease: a node whose agent is silent this long is lost"`
	// AgentFenceAfter is how long after its last lease renewal an agent
	// that cannot renew fences (0: half the lease TTL); it renews every
	// third of it.
	AgentFenceAfter time.Duration `env:"VOYAGER_AGENT_FENCE_AFTER" envDefault:"0s" doc:"an agent that has not renewed its lease for this long (counted from the last renewal's send) stops and removes the node's running containers, before the lease can expire; it renews every third of it, so an etcd outage of two thirds of it (a leader election) fences nothing; 0: half the lease TTL"`
	// AgentFenceGrace is the SIGTERM-to-SIGKILL grace of a fence (0: a
	// fifth of the lease TTL).
	AgentFenceGrace time.Duration `env:"VOYAGER_AGENT_FENCE_GRACE" envDefault:"0s" doc:"time between SIGTERM and SIGKILL when a fence stops containers; fence after + fence grace must be below the lease TTL; 0: a fifth of the lease TTL"`
	// AgentSimulateGPUs, when set, replaces NVML with a made-up inventory.
	AgentSimulateGPUs string `env:"VOYAGER_AGENT_SIMULATE_GPUS" docDefault:"empty" doc:"made-up GPUs such as 8xA100-80GB or 4xA100-80GB,2xH100-80GB, marked simulated (dev, benchmarks); empty: read NVML (voyager dev simulates 8xA100-80GB where NVML is absent)"`
	// AgentSharedGPUs names the GPUs offered in fractions.
	AgentSharedGPUs string `env:"VOYAGER_AGENT_SHARED_GPUS" docDefault:"empty" doc:"GPUs of this node offered in fractions (sessions' gpuShareMiB, enforced by a CUDA MPS daemon per GPU): all, or a comma-separated list of GPU indexes or UUIDs; a GPU with MIG enabled is never shared (its MIG layout is the operator's, never changed); empty: none"`
	// AgentMPSControl is the MPS control daemon's binary.
	AgentMPSControl string `env:"VOYAGER_AGENT_MPS_CONTROL" envDefault:"nvidia-cuda-mps-control" doc:"the CUDA MPS control binary the agent starts (with -d) for each shared GPU, with its pipe and log directories under <data dir>/mps/<GPU UUID>; a simulated shared GPU gets none"`
	// AgentGPUMode is cdi or env.
	AgentGPUMode string `env:"VOYAGER_AGENT_GPU_MODE" envDefault:"cdi" doc:"how containers get their GPUs: cdi (CDI device names nvidia.com/gpu=<uuid>) or env (NVIDIA_VISIBLE_DEVICES, with nvidia-container-runtime as the OCI runtime)"`
	// AgentCDISpecDirs are where CDI specs are read.
	AgentCDISpecDirs []string `env:"VOYAGER_AGENT_CDI_SPEC_DIRS" envSeparator:"," envDefault:"/etc/cdi,/var/run/cdi" doc:"comma-separated directories of CDI specs (nvidia-ctk cdi generate writes /etc/cdi/nvidia.yaml)"`
	// AgentImage runs sessions that name no image.
	AgentImage string `env:"VOYAGER_AGENT_IMAGE" envDefault:"voyager.local/busybox:latest" doc:"image of sessions that name none (deploy/dev-setup.sh imports a busybox one under this name)"`
	// AgentPorts is the range of host ports handed to sessions.
	AgentPorts string `env:"VOYAGER_AGENT_PORTS" envDefault:"31000-31999" doc:"host ports handed to sessions (Jupyter, Ray), as first-last; keep them outside the ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default), as the default is"`
	// AgentStopGrace is the time between SIGTERM and SIGKILL.
	AgentStopGrace time.Duration `env:"VOYAGER_AGENT_STOP_GRACE" envDefault:"10s" doc:"time between SIGTERM and SIGKILL when a session stops"`
	// AgentHomeDir holds one home directory per user; empty means
	// DataDir/homes (the agent command fills it in).
	AgentHomeDir string `env:"VOYAGER_AGENT_HOME_DIR" docDefault:"<data dir>/homes" doc:"host directory of per-user homes, mounted at /home/jovyan in the user's sessions"`
	// AgentUID is the user id that runs session containers.
	AgentUID int `env:"VOYAGER_AGENT_UID" envDefault:"1000" doc:"user id that runs session containers (never 0 unless set so)"`
	// AgentGID is the group id that runs session containers.
	AgentGID int `env:"VOYAGER_AGENT_GID" envDefault:"100" doc:"group id that runs session containers"`
	// AgentLogMaxMiB caps each container's log file.
	AgentLogMaxMiB int `env:"VOYAGER_AGENT_LOG_MAX_MIB" envDefault:"10" doc:"size cap of each session's log file (<data dir>/logs), in MiB; older output is trimmed"`

	// AgentNetwork is isolated (a network namespace per session, CNI) or
	// host (the machine's network: debugging only).
	AgentNetwork string `env:"VOYAGER_AGENT_NETWORK" envDefault:"isolated" doc:"sessions' network: isolated (each its own network namespace on a CNI bridge; only published ports are reachable, and sessions reach neither the machine's listeners nor each other) or host (the machine's network, no isolation: debugging only)"`
	// AgentNetworkName names this agent's bridge, subnet and firewall
	// chains; empty derives one from the node, namespace and data dir.
	AgentNetworkName string `env:"VOYAGER_AGENT_NETWORK_NAME" docDefault:"derived from node, namespace and data dir" doc:"name of this agent's session network (bridge vy<hash>, CNI network voyager-<name>, firewall chains VY<hash>-…): unique per agent on a machine"`
	// AgentNetworkSubnet is the IPv4 subnet of the sessions' addresses.
	AgentNetworkSubnet string `env:"VOYAGER_AGENT_NETWORK_SUBNET" docDefault:"a /24 in 10.128.0.0/10 derived from the name, claimed in etcd where no other node holds it" doc:"IPv4 subnet (CIDR) the sessions' addresses come from; refused at start if it overlaps another node's claim (subnets/<node>)"`
	// AgentNetworkDeny are networks sessions may never reach.
	AgentNetworkDeny []string `env:"VOYAGER_AGENT_NETWORK_DENY" envSeparator:"," envDefault:"169.254.0.0/16" doc:"comma-separated networks (CIDR) sessions may not reach at all: the control plane's (etcd, API), the cloud metadata service's"`
	// AgentDenyControlPlane denies sessions every control-plane endpoint
	// the agent knows, besides AgentNetworkDeny.
	AgentDenyControlPlane bool `env:"VOYAGER_AGENT_NETWORK_DENY_CONTROL_PLANE" envDefault:"true" doc:"deny sessions every control-plane endpoint the agent knows (the etcd members' client and peer ports, every API, placer and other node's agent, from etcd), besides VOYAGER_AGENT_NETWORK_DENY; false only for debugging"`

	// AgentNetworkAllow are ip:port endpoints every session may reach.
	AgentNetworkAllow []string `env:"VOYAGER_AGENT_NETWORK_ALLOW" envSeparator:"," docDefault:"empty" doc:"comma-separated ip:port endpoints every session may reach although the network rules refuse them, such as JupyterHub's API (its hub_connect_url) on this machine"`
	// AgentJobRoutes is how a multi-node job's parts reach each other's
	// containers: direct, fabric or off.
	// AgentFenceKeeper is how the node is fenced when its agent cannot
	// fence it: spawn, external or off.
	AgentFenceKeeper string `env:"VOYAGER_AGENT_FENCE_KEEPER" envDefault:"spawn" doc:"what stops the node's containers at the fence deadline when the agent itself cannot (killed, paused, hung in a call): spawn (the agent starts voyager fence-keeper, a process of its own that outlives it, watching <data dir>/fence), external (a keeper runs as a service of its own, as deploy/systemd/voyager-fence-keeper.service; the agent warns while none runs) or off (none: only a live agent fences)"`
	AgentJobRoutes   string `env:"VOYAGER_AGENT_JOB_ROUTES" envDefault:"direct" doc:"how a multi-node job's parts reach each other at their containers' own addresses on an isolated network (NCCL, Gloo): direct (a route to each peer node's container subnet through that node; the nodes share a link), fabric (the network between the nodes routes container subnets already) or off (parts reach only each other's published MASTER_PORT and peer ports)"`
	// AgentCNIPluginDirs are searched for the CNI plugins.
	AgentCNIPluginDirs []string `env:"VOYAGER_AGENT_CNI_PLUGIN_DIRS" envSeparator:"," envDefault:"/usr/lib/cni,/opt/cni/bin" doc:"comma-separated directories of the CNI plugins bridge, host-local, portmap, firewall and loopback (apt-get install containernetworking-plugins)"`

	// AgentActivityEvery is how often the agent samples each session's
	// Jupyter and GPU activity.
	AgentActivityEvery time.Duration `env:"VOYAGER_AGENT_ACTIVITY_EVERY" envDefault:"30s" doc:"how often the agent samples each running session's Jupyter activity (/api/status, busy kernels) and GPU use (NVML) into its status"`
	// AgentGPUBusyPercent is the GPU utilisation that counts as activity.
	AgentGPUBusyPercent int `env:"VOYAGER_AGENT_GPU_BUSY_PERCENT" envDefault:"10" doc:"GPU utilisation (percent) at or above which a session's GPU counts as activity, so a training run is never culled as idle"`
	// AgentGPUUnusedAfter is how long an allocated GPU may run no process
	// before it is flagged unused.
	AgentGPUUnusedAfter time.Duration `env:"VOYAGER_AGENT_GPU_UNUSED_AFTER" envDefault:"30m" doc:"an allocated GPU with no process and no utilisation this long is flagged unused (in /metrics and the node view)"`

	// Lifecycle rules (voyager placer, voyager dev; the API for extensions).

	// IdleTimeout is the cluster default idle timeout of notebooks.
	IdleTimeout time.Duration `env:"VOYAGER_IDLE_TIMEOUT" envDefault:"2h" doc:"a notebook idle this long (no Jupyter activity, no busy kernel, no GPU above the busy percent) is warned, then stopped; a session's or profile's idleTimeout overrides it; 0 turns idle culling off"`
	// StopWarning is how far ahead of a stop for idleness, max runtime or
	// a drain without a deadline the owner is warned.
	StopWarning time.Duration `env:"VOYAGER_STOP_WARNING" envDefault:"15m" doc:"warning ahead of a system stop: the grace after an idle warning, the lead before max runtime ends"`
	// StartTimeout is how long after its bind a session may take to
	// run before its agent ends it StartFailed.
	StartTimeout time.Duration `env:"VOYAGER_START_TIMEOUT" envDefault:"300s" doc:"a session not running this long after it was bound (image pull, container creation, a notebook's Jupyter answering) ends StartFailed, its message naming the stage it was stuck at (pull, create, readiness), and releases its GPUs (Failed, or a restart for OnFailure batch sessions); JupyterHub's own start_timeout is 300 s too; 0 turns the deadline off"`
	// MaxRuntime is the cluster default max runtime.
	MaxRuntime time.Duration `env:"VOYAGER_MAX_RUNTIME" envDefault:"0s" doc:"sessions that name no maxRuntime (nor their profile) stop this long after they were bound; 0: no default limit"`
	// MaxRuntimeCap is the most any session may ask for, extensions included.
	MaxRuntimeCap time.Duration `env:"VOYAGER_MAX_RUNTIME_CAP" envDefault:"0s" doc:"the longest maxRuntime a session may ask for or be extended to by its owner; 0: no cap"`
	// DrainDeadline is how long a drain without a deadline gives notebooks.
	DrainDeadline time.Duration `env:"VOYAGER_DRAIN_DEADLINE" envDefault:"1h" doc:"when a node is drained without a deadline, its notebook sessions stop this long after the drain (batch sessions run to completion)"`
	// NodePowerDownAfter is how long a node must have run nothing before
	// the node view marks it one that may be powered down.
	NodePowerDownAfter time.Duration `env:"VOYAGER_NODE_POWER_DOWN_AFTER" envDefault:"30m" doc:"a node that has held no session this long is marked powerDown in GET /api/v1/nodes and voyager node list (an operator's hook: Voyager powers nothing); 0 marks every empty node"`
	// PreemptGrace is the time a preempted session has between its warning and its stop.
	PreemptGrace time.Duration `env:"VOYAGER_PREEMPT_GRACE" envDefault:"2m" doc:"time between a preemption warning and the victim's stop (then it is re-queued)"`
	// PreemptNotebooks lets preemption take preemptible notebooks too.
	PreemptNotebooks bool `env:"VOYAGER_PREEMPT_NOTEBOOKS" envDefault:"false" doc:"also preempt notebook sessions marked preemptible; by default only batch sessions are preempted"`
	// ElasticInterval is the least time between two resizes of one elastic job.
	ElasticInterval time.Duration `env:"VOYAGER_ELASTIC_RESIZE_INTERVAL" envDefault:"5m" doc:"the least time between two resizes of one elastic job (a resize restarts it at the new size)"`
	// ElasticNotice is the time between a resize's warning and its stop.
	ElasticNotice time.Duration `env:"VOYAGER_ELASTIC_RESIZE_NOTICE" envDefault:"0s" doc:"time between an elastic job's resize warning and its stop (then its workers get SIGTERM and VOYAGER_AGENT_STOP_GRACE to checkpoint, and start again at the new size)"`
	// PlacerGoodput makes elastic resizes goodput-aware.
	PlacerGoodput bool `env:"VOYAGER_PLACER_GOODPUT" envDefault:"false" doc:"elastic grows and shrinks prefer the jobs whose goodput reports (docs/api.md) say a GPU adds the most or takes the least throughput; jobs without reports are taken to scale linearly, and with none reporting resizes are size-blind"`
	// RestartBackoff is the first restart delay of OnFailure sessions that name none.
	RestartBackoff time.Duration `env:"VOYAGER_RESTART_BACKOFF" envDefault:"10s" doc:"delay before the first restart of a failed OnFailure batch session that names no backoff; it doubles each restart"`
	// RestartBackoffMax caps the doubling restart delay.
	RestartBackoffMax time.Duration `env:"VOYAGER_RESTART_BACKOFF_MAX" envDefault:"10m" doc:"the longest delay between restarts of a failing OnFailure session"`

	// Retention of finished sessions (voyager placer, voyager dev).

	// Retention is how long a finished session stays in etcd.
	Retention time.Duration `env:"VOYAGER_RETENTION" envDefault:"168h" doc:"finished sessions, and finished job arrays with their elements, leave etcd this long after they end (their final records go to the history file first; one placer at a time does it), and agents delete the log files of containers gone this long"`
	// RetentionAccrualWait is how much longer a finished session whose
	// last bound attempt the usage accountant has not recorded stays.
	RetentionAccrualWait time.Duration `env:"VOYAGER_RETENTION_ACCRUAL_WAIT" envDefault:"24h" doc:"a finished session whose last bound attempt the usage accountant has not yet recorded stays in etcd past VOYAGER_RETENTION, waiting for it, at most this much longer; past it (the accountant stopped) it leaves anyway, its GPU-hours are lost, and the placer logs it and counts it in voyager_retention_sessions_unaccounted_total"`
	// HistoryFile is the append-only record of retired sessions; Load
	// sets it to DataDir/history/sessions.jsonl when empty.
	HistoryFile string `env:"VOYAGER_HISTORY_FILE" docDefault:"<data dir>/history/sessions.jsonl" doc:"append-only history of retired sessions, one JSON record a line, on the machine of the placer that retires them"`
}

// MaxSessionsPerNodeLimit is the largest VOYAGER_MAX_SESSIONS_PER_NODE:
// a ledger of that many of the largest allocations the API admits stays
// under half of etcd's 1.5 MiB request limit (placer's ledger size test).
const MaxSessionsPerNodeLimit = 512

// Setting describes one configuration variable, as declared by Config's
// struct tags.
type Setting struct {
	// Env is the environment variable, for example VOYAGER_HTTP_ADDR.
	Env string
	// Flag is the flag name (without dashes), for example http-addr.
	Flag string
	// Default is the documented default: envDefault, else docDefault.
	Default string
	// Doc is the one-line meaning.
	Doc string

	field string
}

// settings is computed once from Config's tags.
var settings = func() []Setting {
	t := reflect.TypeFor[Config]()
	out := make([]Setting, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Tag.Get("env")
		if name == "" {
			continue
		}
		def, ok := f.Tag.Lookup("envDefault")
		if !ok {
			def = f.Tag.Get("docDefault")
		}
		out = append(out, Setting{
			Env:     name,
			Flag:    flagName(name),
			Default: def,
			Doc:     f.Tag.Get("doc"),
			field:   f.Name,
		})
	}
	return out
}()

// flagName derives a flag from a variable: VOYAGER_ETCD_PREFIX → etcd-prefix.
func flagName(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "VOYAGER_")), "_", "-")
}

// Settings returns every setting in declaration order.
func Settings() []Setting {
	return append([]Setting(nil), settings...)
}

// pick returns the settings named by envs, or all when envs is empty.
func pick(envs []string) []Setting {
	if len(envs) == 0 {
		return Settings()
	}
	var out []Setting
	for _, e := range envs {
		for _, s := range settings {
			if s.Env == e {
				out = append(out, s)
			}
		}
	}
	return out
}

// AddFlags registers on fs one string flag per setting named in envs (all
// settings when envs is empty). A flag only counts when given explicitly:
// then it wins over the environment (see Load).
func AddFlags(fs *pflag.FlagSet, envs ...string) {
	for _, s := range pick(envs) {
		fs.String(s.Flag, "", fmt.Sprintf("%s (overrides %s; default %s)", s.Doc, s.Env, s.Default))
	}
}

// WriteEnvHelp writes the settings named in envs (all when empty) as an
// aligned list of variable, default and meaning, for --help output.
func WriteEnvHelp(w io.Writer, envs ...string) {
	list := pick(envs)
	width := 0
	for _, s := range list {
		width = max(width, len(s.Env))
	}
	for _, s := range list {
		fmt.Fprintf(w, "  %-*s  %s\n  %-*s  default: %s\n", width, s.Env, s.Doc, width, "", s.Default)
	}
}

// InvalidError reports a setting whose value is not valid.
type InvalidError struct {
	// Env is the variable of the setting.
	Env string
	// Flag is the flag that carried the value, or empty when it came from
	// the environment.
	Flag string
	// Value is the rejected value.
	Value string
	// Want says what would be valid.
	Want string
}

// Error names the variable (and flag), the value and what is valid.
func (e *InvalidError) Error() string {
	if e.Flag != "" {
		return fmt.Sprintf("invalid --%s=%q (flag for %s): want %s", e.Flag, e.Value, e.Env, e.Want)
	}
	return fmt.Sprintf("invalid %s=%q: want %s", e.Env, e.Value, e.Want)
}

// Load reads the settings from environ (os.Environ's form, KEY=value) and
// from the flags of fs that were set explicitly (fs may be nil; it must
// already be parsed). A flag wins over its variable. Every invalid value is
// reported; the error joins one *InvalidError per bad setting.
func Load(environ []string, fs *pflag.FlagSet) (Config, error) {
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	fromFlag := map[string]string{} // env name → flag name
	if fs != nil {
		byFlag := map[string]Setting{}
		for _, s := range settings {
			byFlag[s.Flag] = s
		}
		fs.Visit(func(f *pflag.Flag) {
			if s, ok := byFlag[f.Name]; ok {
				vars[s.Env] = f.Value.String()
				fromFlag[s.Env] = f.Name
			}
		})
	}
	invalid := func(envName, want string) *InvalidError {
		return &InvalidError{Env: envName, Flag: fromFlag[envName], Value: vars[envName], Want: want}
	}

	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: vars}); err != nil {
		var agg env.AggregateError
		if !errors.As(err, &agg) {
			return Config{}, fmt.Errorf("parse environment: %w", err)
		}
		var errs []error
		for _, e := range agg.Errors {
			var pe env.ParseError
			if errors.As(e, &pe) {
				if s, ok := settingOfField(pe.Name); ok {
					errs = append(errs, invalid(s.Env, wantFor(s.Env)))
					continue
				}
			}
			errs = append(errs, fmt.Errorf("parse environment: %w", e))
		}
		return Config{}, errors.Join(errs...)
	}

	cfg.EtcdEndpoints = cleanList(cfg.EtcdEndpoints)
	cfg.LogLevel = strings.ToLower(cfg.LogLevel)
	cfg.LogFormat = strings.ToLower(cfg.LogFormat)
	if cfg.DataDir == "" {
		cfg.DataDir = defaultDataDir(vars)
	} else if abs, err := filepath.Abs(cfg.DataDir); err == nil {
		cfg.DataDir = abs
	}
	if cfg.APIAuditLog == "" && cfg.DataDir != "" {
		cfg.APIAuditLog = filepath.Join(cfg.DataDir, "audit", "api.jsonl")
	}
	if cfg.HistoryFile == "" && cfg.DataDir != "" {
		cfg.HistoryFile = filepath.Join(cfg.DataDir, "history", "sessions.jsonl")
	}

	var errs []error
	for _, ep := range cfg.EtcdEndpoints {
		if !validEndpoint(ep) {
			errs = append(errs, invalid(EnvEtcdEndpoints, wantFor(EnvEtcdEndpoints)))
			break
		}
	}
	if !validPrefix(cfg.EtcdPrefix) {
		errs = append(errs, invalid(EnvEtcdPrefix, wantFor(EnvEtcdPrefix)))
	}
	if cfg.EtcdDialTimeout <= 0 {
		errs = append(errs, invalid(EnvEtcdDialTimeout, wantFor(EnvEtcdDialTimeout)))
	}
	errs = append(errs, validateTLS(cfg, invalid)...)
	for _, a := range []struct{ env, val string }{
		{EnvEtcdClientAddr, cfg.EtcdClientAddr},
		{EnvEtcdPeerAddr, cfg.EtcdPeerAddr},
		{EnvHTTPAddr, cfg.HTTPAddr},
	} {
		if !validHostPort(a.val) {
			errs = append(errs, invalid(a.env, wantFor(a.env)))
		}
	}
	if cfg.EtcdCompaction < 0 {
		errs = append(errs, invalid(EnvEtcdCompaction, wantFor(EnvEtcdCompaction)))
	}
	if cfg.EtcdQuotaMiB < 16 || cfg.EtcdQuotaMiB > 8192 {
		errs = append(errs, invalid(EnvEtcdQuotaMiB, wantFor(EnvEtcdQuotaMiB)))
	}
	if _, ok := levels[cfg.LogLevel]; !ok {
		errs = append(errs, invalid(EnvLogLevel, wantFor(EnvLogLevel)))
	}
	if cfg.LogFormat != "text" && cfg.LogFormat != "json" {
		errs = append(errs, invalid(EnvLogFormat, wantFor(EnvLogFormat)))
	}
	cfg.PlacerStrategy = strings.ToLower(cfg.PlacerStrategy)
	if cfg.PlacerStrategy != "binpack" && cfg.PlacerStrategy != "spread" && cfg.PlacerStrategy != "pack" {
		errs = append(errs, invalid(EnvPlacerStrategy, wantFor(EnvPlacerStrategy)))
	}
	if cfg.PlacerReserveAfter < 0 {
		errs = append(errs, invalid(EnvPlacerReserveAfter, wantFor(EnvPlacerReserveAfter)))
	}
	if cfg.PlacerMaxTxnOps < 8 {
		errs = append(errs, invalid(EnvPlacerMaxTxnOps, wantFor(EnvPlacerMaxTxnOps)))
	}
	if cfg.PlacerUsageHalfLife < 0 {
		errs = append(errs, invalid(EnvPlacerUsageHalfLife, wantFor(EnvPlacerUsageHalfLife)))
	}
	if cfg.PlacerLeaseTTL < time.Second {
		errs = append(errs, invalid(EnvPlacerLeaseTTL, wantFor(EnvPlacerLeaseTTL)))
	}
	if cfg.MinCPUMilli < 10 { // CFS enforces no quota under 1 ms per 100 ms period
		errs = append(errs, invalid(EnvMinCPUMilli, wantFor(EnvMinCPUMilli)))
	}
	if cfg.MinMemoryMiB < 4 { // the least a container was seen to start in
		errs = append(errs, invalid(EnvMinMemoryMiB, wantFor(EnvMinMemoryMiB)))
	}
	if cfg.MaxSessionsPerNode < 1 || cfg.MaxSessionsPerNode > MaxSessionsPerNodeLimit {
		errs = append(errs, invalid(EnvMaxSessionsPerNode, wantFor(EnvMaxSessionsPerNode)))
	}
	if cfg.JWTSecret != "" && len(cfg.JWTSecret) < 32 {
		errs = append(errs, &InvalidError{Env: EnvJWTSecret, Flag: fromFlag[EnvJWTSecret], Value: "(hidden)", Want: wantFor(EnvJWTSecret)})
	}
	for _, c := range []struct{ env, val string }{
		{EnvJWTRolesClaim, cfg.JWTRolesClaim}, {EnvJWTGroupsClaim, cfg.JWTGroupsClaim},
		{EnvJWTAdminRole, cfg.JWTAdminRole}, {EnvJWTServiceRole, cfg.JWTServiceRole},
	} {
		if strings.TrimSpace(c.val) == "" {
			errs = append(errs, invalid(c.env, wantFor(c.env)))
		}
	}
	if cfg.JWTAdminRole == cfg.JWTServiceRole && cfg.JWTAdminRole != "" {
		errs = append(errs, invalid(EnvJWTServiceRole, wantFor(EnvJWTServiceRole)))
	}
	if cfg.APIMaxBodyBytes < 1024 {
		errs = append(errs, invalid(EnvAPIMaxBodyBytes, wantFor(EnvAPIMaxBodyBytes)))
	}
	if cfg.APIRate <= 0 {
		errs = append(errs, invalid(EnvAPIRate, wantFor(EnvAPIRate)))
	}
	if cfg.APIBurst < 1 {
		errs = append(errs, invalid(EnvAPIBurst, wantFor(EnvAPIBurst)))
	}
	if cfg.APIIdempotencyTTL < time.Minute {
		errs = append(errs, invalid(EnvAPIIdempotencyTTL, wantFor(EnvAPIIdempotencyTTL)))
	}
	cfg.APIAllowedRegistries = cleanList(cfg.APIAllowedRegistries)
	for _, r := range cfg.APIAllowedRegistries {
		if strings.ContainsAny(r, "/ @") {
			errs = append(errs, invalid(EnvAPIRegistries, wantFor(EnvAPIRegistries)))
			break
		}
	}
	if cfg.APIMaxQueuedPerUser < 0 {
		errs = append(errs, invalid(EnvAPIMaxQueued, wantFor(EnvAPIMaxQueued)))
	}
	if cfg.APIAuditMaxMiB < 1 {
		errs = append(errs, invalid(EnvAPIAuditMaxMiB, wantFor(EnvAPIAuditMaxMiB)))
	}
	if cfg.APIAuditKeep < 1 {
		errs = append(errs, invalid(EnvAPIAuditKeep, wantFor(EnvAPIAuditKeep)))
	}
	if cfg.DefaultShmMiB < 1 {
		errs = append(errs, invalid(EnvDefaultShmMiB, wantFor(EnvDefaultShmMiB)))
	}
	if cfg.UlimitNofile < 1024 || cfg.UlimitNofile > 1<<30 {
		errs = append(errs, invalid(EnvUlimitNofile, wantFor(EnvUlimitNofile)))
	}
	if _, err := ParseMemlock(cfg.UlimitMemlock); err != nil {
		errs = append(errs, invalid(EnvUlimitMemlock, wantFor(EnvUlimitMemlock)))
	}
	if cfg.AgentNode != "" && state.ValidateName("node name", cfg.AgentNode) != nil {
		errs = append(errs, invalid(EnvAgentNode, wantFor(EnvAgentNode)))
	}
	if cfg.AgentContainerd == "" {
		errs = append(errs, invalid(EnvAgentContainerd, wantFor(EnvAgentContainerd)))
	}
	if cfg.AgentNamespace == "" || state.ValidateName("namespace", cfg.AgentNamespace) != nil {
		errs = append(errs, invalid(EnvAgentNamespace, wantFor(EnvAgentNamespace)))
	}
	if cfg.AgentLeaseTTL < 2*time.Second {
		errs = append(errs, invalid(EnvAgentLeaseTTL, wantFor(EnvAgentLeaseTTL)))
	}
	if after, grace := cfg.FenceTimings(); cfg.AgentFenceAfter < 0 || after+grace >= cfg.AgentLeaseTTL {
		errs = append(errs, invalid(EnvAgentFenceAfter, wantFor(EnvAgentFenceAfter)))
	}
	if cfg.AgentFenceGrace < 0 {
		errs = append(errs, invalid(EnvAgentFenceGrace, wantFor(EnvAgentFenceGrace)))
	}
	cfg.AgentGPUMode = strings.ToLower(cfg.AgentGPUMode)
	if cfg.AgentGPUMode != "cdi" && cfg.AgentGPUMode != "env" {
		errs = append(errs, invalid(EnvAgentGPUMode, wantFor(EnvAgentGPUMode)))
	}
	cfg.AgentCDISpecDirs = cleanList(cfg.AgentCDISpecDirs)
	if _, _, err := ParsePortRange(cfg.AgentPorts); err != nil {
		errs = append(errs, invalid(EnvAgentPorts, wantFor(EnvAgentPorts)))
	}
	if cfg.AgentStopGrace < 0 {
		errs = append(errs, invalid(EnvAgentStopGrace, wantFor(EnvAgentStopGrace)))
	}
	if cfg.AgentUID < 0 {
		errs = append(errs, invalid(EnvAgentUID, wantFor(EnvAgentUID)))
	}
	if cfg.AgentGID < 0 {
		errs = append(errs, invalid(EnvAgentGID, wantFor(EnvAgentGID)))
	}
	if cfg.AgentLogMaxMiB < 1 {
		errs = append(errs, invalid(EnvAgentLogMaxMiB, wantFor(EnvAgentLogMaxMiB)))
	}
	errs = append(errs, validateNetwork(&cfg, func(e string) error { return invalid(e, wantFor(e)) })...)
	if cfg.Retention < time.Minute {
		errs = append(errs, invalid(EnvRetention, wantFor(EnvRetention)))
	}
	if cfg.RetentionAccrualWait < time.Minute {
		errs = append(errs, invalid(EnvRetentionAccrualWait, wantFor(EnvRetentionAccrualWait)))
	}
	if cfg.AgentActivityEvery < 100*time.Millisecond {
		errs = append(errs, invalid(EnvAgentActivityEvery, wantFor(EnvAgentActivityEvery)))
	}
	if cfg.AgentGPUBusyPercent < 0 || cfg.AgentGPUBusyPercent > 100 {
		errs = append(errs, invalid(EnvAgentGPUBusyPercent, wantFor(EnvAgentGPUBusyPercent)))
	}
	for _, d := range []struct {
		env string
		v   time.Duration
	}{
		{EnvAgentGPUUnusedAfter, cfg.AgentGPUUnusedAfter}, {EnvIdleTimeout, cfg.IdleTimeout},
		{EnvStopWarning, cfg.StopWarning}, {EnvMaxRuntime, cfg.MaxRuntime}, {EnvMaxRuntimeCap, cfg.MaxRuntimeCap}, {EnvStartTimeout, cfg.StartTimeout},
		{EnvDrainDeadline, cfg.DrainDeadline}, {EnvPreemptGrace, cfg.PreemptGrace}, {EnvNodePowerDownAfter, cfg.NodePowerDownAfter},
		{EnvElasticInterval, cfg.ElasticInterval}, {EnvElasticNotice, cfg.ElasticNotice},
		{EnvRestartBackoff, cfg.RestartBackoff}, {EnvRestartBackoffMax, cfg.RestartBackoffMax},
	} {
		if d.v < 0 {
			errs = append(errs, invalid(d.env, wantFor(d.env)))
		}
	}
	if cfg.MaxRuntimeCap > 0 && cfg.MaxRuntime > cfg.MaxRuntimeCap {
		errs = append(errs, invalid(EnvMaxRuntime, "a duration no longer than "+EnvMaxRuntimeCap+" ("+cfg.MaxRuntimeCap.String()+")"))
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return cfg, nil
}

// wantFor says what a valid value of a setting looks like.
func wantFor(envName string) string {
	switch envName {
	case EnvEtcdEndpoints:
		return "comma-separated etcd client URLs such as http://10.0.0.1:2379,http://10.0.0.2:2379 (scheme http or https, or host:port)"
	case EnvEtcdPrefix:
		return `a key prefix of one or more /segments of letters, digits, ".", "_" or "-", with no trailing "/", such as /voyager`
	case EnvEtcdDialTimeout:
		return "a positive duration such as 5s, 500ms or 1m30s"
	case EnvEtcdClientAddr, EnvEtcdPeerAddr, EnvHTTPAddr:
		return "host:port with a port from 1 to 65535, such as 127.0.0.1:7070"
	case EnvEtcdCA, EnvEtcdCert, EnvEtcdKey, EnvHTTPTLSCert, EnvHTTPTLSKey, EnvHTTPClientCA:
		return "the path of a readable PEM file, or empty"
	case EnvEtcdPassword:
		return "the path of a readable file whose first line is the password (required when " + EnvEtcdUser + " is set)"
	case EnvEtcdUser:
		return "an etcd user name without ':' or spaces, such as voyager-api"
	case EnvLogLevel:
		return "one of debug, info, warn, error"
	case EnvLogFormat:
		return "one of text, json"
	case EnvPlacerStrategy:
		return "one of binpack, spread, pack"
	case EnvPlacerReserveAfter:
		return "a duration of 0 or more, such as 10m (0 turns reservations off)"
	case EnvPlacerMaxTxnOps:
		return "a whole number from 8 up to etcd's --max-txn-ops (default 128)"
	case EnvPlacerUsageHalfLife:
		return "a duration of 0 or more, such as 168h (0 turns usage decay off)"
	case EnvPlacerLeaseTTL:
		return "a duration of at least 1s, such as 10s"
	case EnvMinCPUMilli:
		return "a whole number of milli-cores of at least 10 (the least CFS enforces: 1 ms per 100 ms), such as 100"
	case EnvMinMemoryMiB:
		return "a whole number of MiB of at least 4 (a container needs a few to start), such as 64"
	case EnvMaxSessionsPerNode:
		return fmt.Sprintf("a whole number from 1 to %d, such as 256", MaxSessionsPerNodeLimit)
	case EnvJWTSecret:
		return "a secret of at least 32 bytes (for example: head -c 32 /dev/urandom | base64), or empty"
	case EnvJWTRolesClaim, EnvJWTGroupsClaim:
		return "a claim name such as roles, or a dotted path such as realm_access.roles"
	case EnvJWTAdminRole:
		return "a non-empty role name such as admin"
	case EnvJWTServiceRole:
		return "a non-empty role name such as service, different from the admin role"
	case EnvAPIMaxBodyBytes:
		return "a whole number of bytes of at least 1024, such as 1048576"
	case EnvAPIRate:
		return "a number of requests per second above 0, such as 50"
	case EnvAPIBurst:
		return "a whole number of at least 1, such as 100"
	case EnvAPIIdempotencyTTL:
		return "a duration of at least 1m, such as 24h"
	case EnvAPIRegistries:
		return "comma-separated registry hosts such as docker.io,registry.example.com:5000, or empty"
	case EnvAPIMaxQueued:
		return "a whole number of 0 (no cap) or more, such as 100"
	case EnvAPIAuditMaxMiB:
		return "a whole number of MiB of at least 1, such as 64"
	case EnvAPIAuditKeep:
		return "a whole number of at least 1, such as 8"
	case EnvDefaultShmMiB:
		return "a whole number of MiB of at least 1, such as 8192"
	case EnvUlimitNofile:
		return "a whole number from 1024 to 1073741824 (and at most the nodes' fs.nr_open), such as 1048576"
	case EnvUlimitMemlock:
		return "unlimited, or a whole number of KiB of at least 64, such as 65536"
	case EnvAgentNode:
		return "1-63 lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit, such as gpu-07"
	case EnvAgentContainerd:
		return "the path of containerd's socket, such as /run/containerd/containerd.sock"
	case EnvAgentNamespace:
		return "a containerd namespace of lower-case letters, digits, '.', '_' or '-', such as voyager"
	case EnvAgentLeaseTTL:
		return "a duration of at least 2s, such as 10s"
	case EnvAgentFenceAfter:
		return "a duration of 0 or more, such that it plus " + EnvAgentFenceGrace + " is less than " + EnvAgentLeaseTTL + ", such as 5s (0: half the lease TTL)"
	case EnvAgentFenceGrace:
		return "a duration of 0 or more, such as 2s (0: a fifth of the lease TTL)"
	case EnvEtcdCompaction:
		return "a duration of 0 or more, such as 1h or 10m (0 turns compaction off)"
	case EnvEtcdQuotaMiB:
		return "a whole number of MiB from 16 to 8192, such as 2048"
	case EnvAgentGPUMode:
		return "one of cdi, env"
	case EnvAgentPorts:
		return "a port range first-last within 1024-65535, such as 31000-31999"
	case EnvRetention:
		return "a duration of at least 1m, such as 168h (7 days)"
	case EnvRetentionAccrualWait:
		return "a duration of at least 1m, such as 24h"
	case EnvAgentStopGrace:
		return "a duration of 0 or more, such as 10s"
	case EnvAgentUID, EnvAgentGID:
		return "a whole number of 0 or more, such as 1000"
	case EnvAgentLogMaxMiB:
		return "a whole number of MiB of at least 1, such as 10"
	case EnvAgentNetwork:
		return "one of isolated, host"
	case EnvAgentJobRoutes:
		return "one of direct, fabric, off"
	case EnvAgentFenceKeeper:
		return "one of spawn, external, off"
	case EnvAgentNetworkName:
		return "1-40 letters, digits, '-' or '_', such as gpu07, or empty"
	case EnvAgentNetworkSubnet:
		return "an IPv4 CIDR such as 10.128.7.0/24, or empty"
	case EnvAgentNetworkDeny:
		return "comma-separated CIDRs such as 169.254.0.0/16,10.0.0.0/24"
	case EnvAgentNetworkAllow:
		return "comma-separated IPv4 ip:port endpoints such as 10.0.0.5:8081"
	case EnvAgentCNIPluginDirs:
		return "comma-separated absolute directories such as /usr/lib/cni,/opt/cni/bin"
	case EnvAgentActivityEvery:
		return "a duration of at least 100ms, such as 30s"
	case EnvAgentGPUBusyPercent:
		return "a whole percent from 0 to 100, such as 10"
	case EnvAgentGPUUnusedAfter, EnvIdleTimeout, EnvStopWarning, EnvMaxRuntime, EnvMaxRuntimeCap, EnvStartTimeout,
		EnvDrainDeadline, EnvPreemptGrace, EnvRestartBackoff, EnvRestartBackoffMax, EnvNodePowerDownAfter, EnvElasticInterval, EnvElasticNotice:
		return "a duration of 0 or more, such as 15m or 2h"
	}
	return "a valid value"
}

// validateNetwork checks the agent's network settings.
func validateNetwork(cfg *Config, invalid func(envName string) error) []error {
	var errs []error
	cfg.AgentNetwork = strings.ToLower(cfg.AgentNetwork)
	if cfg.AgentNetwork != "isolated" && cfg.AgentNetwork != "host" {
		errs = append(errs, invalid(EnvAgentNetwork))
	}
	cfg.AgentJobRoutes = strings.ToLower(cfg.AgentJobRoutes)
	if !slices.Contains([]string{"direct", "fabric", "off"}, cfg.AgentJobRoutes) {
		errs = append(errs, invalid(EnvAgentJobRoutes))
	}
	cfg.AgentFenceKeeper = strings.ToLower(cfg.AgentFenceKeeper)
	if !slices.Contains([]string{"spawn", "external", "off"}, cfg.AgentFenceKeeper) {
		errs = append(errs, invalid(EnvAgentFenceKeeper))
	}
	if n := cfg.AgentNetworkName; n != "" && (len(n) > 40 || strings.Trim(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "") {
		errs = append(errs, invalid(EnvAgentNetworkName))
	}
	if s := cfg.AgentNetworkSubnet; s != "" {
		if ip, _, err := net.ParseCIDR(s); err != nil || ip.To4() == nil {
			errs = append(errs, invalid(EnvAgentNetworkSubnet))
		}
	}
	cfg.AgentNetworkDeny = cleanList(cfg.AgentNetworkDeny)
	for _, c := range cfg.AgentNetworkDeny {
		if _, _, err := net.ParseCIDR(c); err != nil {
			errs = append(errs, invalid(EnvAgentNetworkDeny))
			break
		}
	}
	cfg.AgentNetworkAllow = cleanList(cfg.AgentNetworkAllow)
	for _, a := range cfg.AgentNetworkAllow {
		host, port, err := net.SplitHostPort(a)
		n, perr := strconv.Atoi(port)
		if ip := net.ParseIP(host); err != nil || ip == nil || ip.To4() == nil || perr != nil || n < 1 || n > 65535 {
			errs = append(errs, invalid(EnvAgentNetworkAllow))
			break
		}
	}
	cfg.AgentCNIPluginDirs = cleanList(cfg.AgentCNIPluginDirs)
	for _, d := range cfg.AgentCNIPluginDirs {
		if !filepath.IsAbs(d) {
			errs = append(errs, invalid(EnvAgentCNIPluginDirs))
			break
		}
	}
	return errs
}

func settingOfField(field string) (Setting, bool) {
	for _, s := range settings {
		if s.field == field {
			return s, true
		}
	}
	return Setting{}, false
}

// defaultDataDir follows the XDG base directory spec: $XDG_DATA_HOME if it
// is absolute, else $HOME/.local/share. Empty if neither is known.
func defaultDataDir(vars map[string]string) string {
	if x := vars["XDG_DATA_HOME"]; filepath.IsAbs(x) {
		return filepath.Join(x, "voyager")
	}
	if h := vars["HOME"]; h != "" {
		return filepath.Join(h, ".local", "share", "voyager")
	}
	return ""
}

func cleanList(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func validEndpoint(ep string) bool {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
	}
	return validHostPort(ep)
}

// validPrefix defers to the state package, the one place that knows keys.
func validPrefix(p string) bool {
	_, err := state.NewKeys(p)
	return err == nil
}

func validHostPort(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil || strings.ContainsAny(host, " \t") {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}

var levels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// ParsePortRange reads a port range such as "40000-40999".
func ParsePortRange(s string) (first, last int, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	if ok {
		first, err = strconv.Atoi(a)
		if err == nil {
			last, err = strconv.Atoi(b)
		}
	}
	if !ok || err != nil || first < 1024 || last > 65535 || first > last {
		return 0, 0, fmt.Errorf("parse port range %q: want first-last within 1024-65535, such as 31000-31999", s)
	}
	return first, last, nil
}

// ParseMemlock reads a locked-memory limit: "unlimited" (-1) or a whole
// number of KiB of at least 64.
func ParseMemlock(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "unlimited") {
		return state.UlimitUnlimited, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 64 || n > 1<<40 {
		return 0, fmt.Errorf("parse memlock limit %q: want unlimited or a whole number of KiB of at least 64", s)
	}
	return n, nil
}

// MemlockKiB returns VOYAGER_ULIMIT_MEMLOCK in KiB, -1 for unlimited
// (Load has validated it).
func (c Config) MemlockKiB() int64 {
	n, _ := ParseMemlock(c.UlimitMemlock)
	return n
}

// FenceTimings returns the agent's fence deadline and fence grace, with
// their zero values replaced by their defaults: half and a fifth of the
// lease TTL.
func (c Config) FenceTimings() (after, grace time.Duration) {
	after, grace = c.AgentFenceAfter, c.AgentFenceGrace
	if after == 0 {
		after = c.AgentLeaseTTL / 2
	}
	if grace == 0 {
		grace = c.AgentLeaseTTL / 5
	}
	return after, grace
}

// RequireEndpoints returns an error that says how to set
// VOYAGER_ETCD_ENDPOINTS when it is empty. Every subcommand except
// `voyager dev` calls it: only dev can run an embedded etcd.
func (c Config) RequireEndpoints() error {
	if len(c.EtcdEndpoints) == 0 {
		return fmt.Errorf("%s is empty: set it (or --%s) to the etcd client URLs, for example http://10.0.0.1:2379; only `voyager dev` runs an embedded etcd",
			EnvEtcdEndpoints, flagName(EnvEtcdEndpoints))
	}
	return nil
}

// NewLogger returns a slog logger writing to w at LogLevel in LogFormat.
func (c Config) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: levels[c.LogLevel]}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
