package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/voyager-gpu/voyager/internal/audit"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// Config tunes the API. Auth is required; every other field has a default.
type Config struct {
	// Auth says which tokens are accepted.
	Auth AuthConfig
	// MaxBodyBytes caps request bodies. Default 1 MiB.
	MaxBodyBytes int64
	// Rate and Burst bound requests per subject (a token bucket). Defaults
	// 50 per second and 100.
	Rate  float64
	Burst int
	// IdempotencyTTL is how long an Idempotency-Key is remembered.
	// Default 24h.
	IdempotencyTTL time.Duration
	// Plan are the placer's options, so that queue views order and explain
	// the queue as the placer does.
	Plan placer.PlanOptions
	// UsageHalfLife is the placers' VOYAGER_PLACER_USAGE_HALF_LIFE: above
	// zero, queue views plan with the teams' decayed GPU-hours as the
	// placers do (queuedecay.go). 0: without, as placers then plan.
	UsageHalfLife time.Duration
	// RuntimeEstimates is the placers' VOYAGER_PLACER_RUNTIME_ESTIMATES:
	// on, queue views plan with the owners' recent run times (runtimes/)
	// as the placers do (queueruntimes.go). Off: without, as placers then
	// plan.
	RuntimeEstimates bool
	// HTTPClient fetches logs from node agents. Default: a client with no
	// overall timeout (logs may be followed for hours).
	HTTPClient *http.Client
	// Logger receives the API's logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// SyncTimeout bounds how long a request that needs the caches waits
	// for their first list. Default 5s.
	SyncTimeout time.Duration
	// MaxRuntime is the cluster's default max runtime, for sessions whose
	// spec sets none: what an extension extends and what runsUntil counts
	// from. 0: no default limit.
	MaxRuntime time.Duration
	// MaxRuntimeCap is the longest max runtime a session may ask for or be
	// extended to. 0: no cap.
	MaxRuntimeCap time.Duration
	// PowerDownAfter is how long a node must have held no session before
	// the node view marks it powerDown (VOYAGER_NODE_POWER_DOWN_AFTER).
	PowerDownAfter time.Duration
	// AllowedRegistries are the registries images may come from (such as
	// docker.io, registry.example.com:5000). Empty: any.
	AllowedRegistries []string
	// MaxQueuedPerUser caps the sessions one user may have queued at
	// once. 0: no cap.
	MaxQueuedPerUser int
	// MinCPUMilli and MinMemoryMiB are the least a session or Ray worker
	// may ask for. Defaults 100 and 64.
	MinCPUMilli, MinMemoryMiB int64
	// DefaultShmMiB sizes /dev/shm of sessions that name no shmMiB (at
	// most half their memory). Default 8192.
	DefaultShmMiB int64
	// UlimitNofile is the open-file limit sessions get and the most they
	// may ask for. Default 1048576.
	UlimitNofile int64
	// UlimitMemlockKiB is the locked-memory limit sessions get and the
	// most they may ask for, state.UlimitUnlimited (the default, as 0) for
	// none.
	UlimitMemlockKiB int64
	// ExecAuditLog is the file (JSON lines, appended) that records every
	// exec and port-forward into a session (ExecRecord); empty: the API's
	// log alone.
	ExecAuditLog string
	// Audit receives a record of every state-changing call (and GET
	// /api/v1/audit reads it back). Nil: none is kept.
	Audit *audit.Log
}

// admission returns the request bounds of a's configuration. The most Ray
// workers derives from Plan.MaxTxnOps, the placers' transaction limit.
func (a *API) admission() admission {
	return admission{maxRuntimeCap: a.cfg.MaxRuntimeCap, minCPU: a.cfg.MinCPUMilli, minMemory: a.cfg.MinMemoryMiB,
		maxWorkers: placer.MaxRayWorkers(a.cfg.Plan.MaxTxnOps, 0), maxTxnOps: a.cfg.Plan.MaxTxnOps,
		defaultShm: a.cfg.DefaultShmMiB, nofile: a.cfg.UlimitNofile, memlock: a.cfg.UlimitMemlockKiB}
}

// API is the HTTP API. Build it with New, serve Handler, and run Run for
// as long as it serves.
type API struct {
	cli     *clientv3.Client
	keys    state.Keys
	cfg     Config
	log     *slog.Logger
	auth    *verifier
	limits  *limiter
	metrics *metrics
	router  *gin.Engine

	nodes   *watcher.Cache[state.Node]
	ledgers *watcher.Cache[state.Ledger]
	// emptied holds emptied/: when each node's ledger was last emptied,
	// for the node view's emptySince (nodepower.go).
	emptied *watcher.Cache[state.Emptied]
	cordons *watcher.Cache[state.Cordon]
	pending *watcher.Cache[state.QueueEntry]
	quotas  *watcher.Cache[state.Quota]
	teams   *watcher.Cache[state.Team] // orders the queue view as placers order the queue
	// days holds gpuhours/ when UsageHalfLife is set (nil otherwise):
	// the decayed usage the queue view plans with (queuedecay.go).
	days   *watcher.Cache[state.UsageDay]
	decay  placer.DecayedUsage
	status *watcher.Cache[state.Status]
	// ownerRuns holds runtimes/ when RuntimeEstimates is set (nil
	// otherwise): the owners' run times the queue view plans with, and
	// runsMemo the Snapshot.Runtimes built from it (queueruntimes.go).
	ownerRuns *watcher.Cache[state.RuntimeRecord]
	runsMemo  runtimesMemo
	// warns holds warnings/: the metrics count them by reason.
	warns *watcher.Cache[state.Warning]
	// secrets holds secrets/: the URLs with tokens, joined into owners'
	// views only.
	secrets *watcher.Cache[state.Secrets]
	// envs holds specsecrets/: the environment values joined into
	// owners' views only.
	envs *watcher.Cache[state.SpecSecrets]
	// runtimes holds, of each spec under sessions/, only its limits: the
	// queue estimates read the max runtimes of the GPUs' holders from it,
	// never from etcd per request.
	runtimes *watcher.Cache[sessionLimits]
	// queued counts each owner's queued sessions, from pending's events.
	queued *queuedIndex

	leaseMu    sync.Mutex
	lease      clientv3.LeaseID
	leaseUntil time.Time

	// streams ends event and log streams when Run returns, so that a
	// graceful HTTP shutdown does not wait for them.
	streams    context.Context
	endStreams context.CancelFunc

	// shapes is the admission check's index of node shapes.
	shapes shapeIndex
	// plans is the queue plan that positions and reasons are read from.
	plans planCache
	// execAudit records execs and port-forwards (exec_audit.go).
	execAudit *execAudit
}

func init() { gin.SetMode(gin.ReleaseMode) }

// New builds the API over cli, with keys under k. It fails only on an
// unusable Auth configuration.
func New(cli *clientv3.Client, k state.Keys, cfg Config) (*API, error) {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 50
	}
	if cfg.MinCPUMilli <= 0 {
		cfg.MinCPUMilli = 100
	}
	if cfg.MinMemoryMiB <= 0 {
		cfg.MinMemoryMiB = 64
	}
	if cfg.DefaultShmMiB <= 0 {
		cfg.DefaultShmMiB = 8192
	}
	if cfg.UlimitNofile <= 0 {
		cfg.UlimitNofile = 1 << 20
	}
	if cfg.UlimitMemlockKiB == 0 {
		cfg.UlimitMemlockKiB = state.UlimitUnlimited
	}
	if cfg.Plan.MaxTxnOps <= 0 {
		cfg.Plan.MaxTxnOps = state.DefaultMaxTxnOps
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 100
	}
	if cfg.IdempotencyTTL <= 0 {
		cfg.IdempotencyTTL = 24 * time.Hour
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = 5 * time.Second
	}
	v, err := newVerifier(cfg.Auth, cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("build api: %w", err)
	}
	wopt := func(name string) watcher.Options {
		return watcher.Options{Name: "api-" + name, Logger: cfg.Logger}
	}
	a := &API{
		plans:   planCache{nodes: placer.NewPlanCache()},
		cli:     cli,
		keys:    k,
		cfg:     cfg,
		log:     cfg.Logger,
		auth:    v,
		limits:  newLimiter(cfg.Rate, cfg.Burst, cfg.Now),
		metrics: newMetrics(),
		nodes:   watcher.New(cli, k.Nodes(), watcher.JSON[state.Node], wopt("nodes")),
		ledgers: watcher.New(cli, k.Ledgers(), watcher.JSON[state.Ledger], wopt("ledgers")),
		emptied: watcher.New(cli, k.EmptiedDir(), watcher.JSON[state.Emptied], wopt("emptied")),
		cordons: watcher.New(cli, k.Cordons(), watcher.JSON[state.Cordon], wopt("cordons")),
		pending: watcher.New(cli, k.PendingDir(), watcher.JSON[state.QueueEntry], wopt("pending")),
		quotas:  watcher.New(cli, k.Quotas(), watcher.JSON[state.Quota], wopt("quotas")),
		teams:   watcher.New(cli, k.Teams(), watcher.JSON[state.Team], wopt("teams")),
		status:  watcher.New(cli, k.StatusDir(), watcher.JSON[state.Status], wopt("status")),
		warns:   watcher.New(cli, k.Warnings(), watcher.JSON[state.Warning], wopt("warnings")),
		secrets: watcher.New(cli, k.SecretsDir(), watcher.JSON[state.Secrets], wopt("secrets")),
		envs:    watcher.New(cli, k.SpecSecretsDir(), watcher.JSON[state.SpecSecrets], wopt("spec-secrets")),
		// Decoding a spec into sessionLimits keeps its limits alone.
		runtimes: watcher.New(cli, k.Sessions(), watcher.JSON[sessionLimits], wopt("session-limits")),
	}
	a.metrics.cluster = a
	if cfg.UsageHalfLife > 0 {
		a.days = watcher.New(cli, k.GPUHoursDir(), watcher.JSON[state.UsageDay], wopt("gpuhours"))
	}
	if cfg.RuntimeEstimates {
		a.ownerRuns = watcher.New(cli, k.RuntimesDir(), watcher.JSON[state.RuntimeRecord], wopt("runtimes"))
	}
	a.queued = newQueuedIndex()
	a.pending.AddHandler(func(ev watcher.Event[state.QueueEntry]) { a.queued.apply(k, ev) })
	a.streams, a.endStreams = context.WithCancel(context.Background())
	a.execAudit = &execAudit{path: cfg.ExecAuditLog}
	a.router = a.routes()
	return a, nil
}

// Handler serves /api/v1/… and /openapi.json. Mount it on a mux with
// mux.Handle("/api/", h) and mux.Handle("/openapi.json", h).
func (a *API) Handler() http.Handler { return a.router }

// Engine is the API's gin engine, for a package that serves its own
// routes on the same router, behind the same recovery and metrics (the web
// console, console.Mount). Add routes before serving.
func (a *API) Engine() *gin.Engine { return a.router }

// Route is one method and path pattern the API serves.
type Route struct{ Method, Path string }

// Routes lists every route the router serves, in gin's pattern syntax.
func (a *API) Routes() []Route {
	var out []Route
	for _, r := range a.router.Routes() {
		out = append(out, Route{Method: r.Method, Path: r.Path})
	}
	return out
}

// Mount adds the API's routes to mux.
func (a *API) Mount(mux *http.ServeMux) {
	mux.Handle("/api/", a.router)
	mux.Handle("/openapi.json", a.router)
}

// Run keeps the API's caches current until ctx ends; it returns nil then,
// or the first cache failure.
func (a *API) Run(ctx context.Context) error {
	defer a.endStreams()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.nodes.Run(ctx) })
	g.Go(func() error { return a.ledgers.Run(ctx) })
	g.Go(func() error { return a.emptied.Run(ctx) })
	g.Go(func() error { return a.cordons.Run(ctx) })
	g.Go(func() error { return a.pending.Run(ctx) })
	g.Go(func() error { return a.quotas.Run(ctx) })
	g.Go(func() error { return a.teams.Run(ctx) })
	g.Go(func() error { return a.status.Run(ctx) })
	g.Go(func() error { return a.warns.Run(ctx) })
	g.Go(func() error { return a.secrets.Run(ctx) })
	g.Go(func() error { return a.envs.Run(ctx) })
	g.Go(func() error { return a.runtimes.Run(ctx) })
	if a.days != nil {
		g.Go(func() error { return a.days.Run(ctx) })
	}
	if a.ownerRuns != nil {
		g.Go(func() error { return a.ownerRuns.Run(ctx) })
	}
	g.Go(func() error {
		// Plan the queue once the caches are in, so that the first
		// requests at a large site find a plan instead of waiting for one.
		if a.WaitSynced(ctx) == nil {
			a.queuePlan()
		}
		return nil
	})
	// The idempotency lease is not revoked: its records must outlive this
	// process, and etcd expires the lease by itself.
	err := g.Wait()
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}

// WaitSynced blocks until every cache has its first list, or ctx ends.
func (a *API) WaitSynced(ctx context.Context) error {
	caches := []interface{ WaitSynced(context.Context) error }{a.nodes, a.ledgers, a.emptied, a.cordons, a.pending, a.quotas, a.teams, a.status, a.warns, a.secrets, a.envs, a.runtimes}
	if a.days != nil {
		caches = append(caches, a.days)
	}
	if a.ownerRuns != nil {
		caches = append(caches, a.ownerRuns)
	}
	for _, w := range caches {
		if err := w.WaitSynced(ctx); err != nil {
			return fmt.Errorf("wait for api caches: %w", err)
		}
	}
	return nil
}

// streamContext is the request's context, also cancelled when Run ends.
func (a *API) streamContext(c *gin.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(c.Request.Context())
	stop := context.AfterFunc(a.streams, cancel)
	return ctx, func() { stop(); cancel() }
}

// requireSynced answers 503 while the caches have not listed yet (waiting
// up to SyncTimeout): decisions on nodes and the queue need them.
func (a *API) requireSynced(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.SyncTimeout)
	defer cancel()
	if err := a.WaitSynced(ctx); err != nil {
		a.problem(c, http.StatusServiceUnavailable, "Not ready", "the API has not read the cluster state from etcd yet; retry shortly")
		return
	}
	c.Next()
}

// idempotencyLease returns a lease that outlives a record written now by
// at least IdempotencyTTL. One lease serves every record written within a
// tenth of the TTL, so creates do not each cost a lease grant.
func (a *API) idempotencyLease(ctx context.Context) (clientv3.LeaseID, error) {
	a.leaseMu.Lock()
	defer a.leaseMu.Unlock()
	now := a.cfg.Now()
	if a.lease != 0 && now.Before(a.leaseUntil) {
		return a.lease, nil
	}
	slack := a.cfg.IdempotencyTTL / 10
	ttl := int64((a.cfg.IdempotencyTTL + slack + time.Second - 1) / time.Second)
	resp, err := a.cli.Grant(ctx, ttl)
	if err != nil {
		return 0, fmt.Errorf("grant idempotency lease: %w", err)
	}
	a.lease, a.leaseUntil = resp.ID, now.Add(slack)
	return a.lease, nil
}

// routes builds the gin router. Groups carry who may call them: sessions
// and profile reads accept a service token acting for a user; cluster views
// need a user; admin routes need the admin role.
func (a *API) routes() *gin.Engine {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(a.recover, a.observe)
	r.NoRoute(func(c *gin.Context) {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no route %s %s; the routes are listed in /openapi.json", c.Request.Method, c.Request.URL.Path))
	})
	r.NoMethod(func(c *gin.Context) {
		a.problem(c, http.StatusMethodNotAllowed, "Method not allowed", fmt.Sprintf("%s is not allowed on %s; see /openapi.json", c.Request.Method, c.Request.URL.Path))
	})
	r.GET("/openapi.json", a.openAPI)
	v1 := r.Group("/api/v1", a.auditCall, a.capBody, a.authenticate, a.rateLimit)
	v1.GET("/openapi.json", a.openAPI)
	v1.GET("/whoami", a.whoami)

	svc := v1.Group("", a.allowService)
	svc.POST("/sessions", a.requireSynced, a.createSession)
	svc.GET("/sessions", a.listSessions)
	svc.GET("/sessions/:id", a.requireSynced, a.getSession)
	svc.POST("/sessions/:id/stop", a.stopSession)
	svc.POST("/sessions/:id/extend", a.extendSession)
	svc.DELETE("/sessions/:id", a.stopSession)
	svc.GET("/sessions/:id/events", a.sessionEvents)
	svc.GET("/sessions/:id/logs", a.sessionLogs)
	for _, m := range dashboardMethods {
		svc.Handle(m, "/sessions/:id/ray/dashboard/*path", a.rayDashboard)
	}
	svc.POST("/arrays", a.requireSynced, a.createArray)
	svc.GET("/arrays", a.listArrays)
	svc.GET("/arrays/:id", a.getArray)
	svc.POST("/arrays/:id/stop", a.stopArray)
	svc.GET("/profiles", a.listProfiles)
	svc.GET("/profiles/:name", a.getProfile)
	svc.GET("/volumes", a.listVolumes)
	svc.GET("/volumes/:name", a.getVolume)
	// What is free now: JupyterHub's spawn form shows it to the user.
	svc.GET("/nodes", a.requireSynced, a.listNodes)

	a.streamRoutes(v1)

	usr := v1.Group("", a.denyService, a.requireSynced)
	usr.GET("/queue", a.queue)
	usr.GET("/usage", a.usageReport)

	adm := v1.Group("", a.denyService, a.requireAdmin)
	adm.POST("/nodes/:name/cordon", a.cordonNode)
	adm.POST("/nodes/:name/uncordon", a.uncordonNode)
	adm.POST("/nodes/:name/drain", a.drainNode)
	adm.PUT("/profiles/:name", a.putProfile)
	adm.DELETE("/profiles/:name", a.deleteProfile)
	adm.GET("/quotas", a.listQuotas)
	adm.PUT("/quotas/:scope/:name", a.putQuota)
	adm.DELETE("/quotas/:scope/:name", a.deleteQuota)
	adm.PUT("/volumes/:name", a.putVolume)
	adm.DELETE("/volumes/:name", a.deleteVolume)
	a.teamRoutes(svc, adm)
	adm.GET("/audit", a.listAudit)
	return r
}

const principalKey = "voyager.principal"

func principalOf(c *gin.Context) Principal {
	p, _ := c.Get(principalKey)
	pr, _ := p.(Principal)
	return pr
}

// capBody limits the request body to MaxBodyBytes.
func (a *API) capBody(c *gin.Context) {
	if c.Request.Body != nil {
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, a.cfg.MaxBodyBytes)
	}
	c.Next()
}

// authenticate verifies the bearer token and resolves on-behalf-of.
func (a *API) authenticate(c *gin.Context) {
	h := c.GetHeader("Authorization")
	scheme, raw, ok := strings.Cut(h, " ")
	if h == "" || !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(raw) == "" {
		c.Header("WWW-Authenticate", `Bearer realm="voyager"`)
		a.problem(c, http.StatusUnauthorized, "Unauthorized", "missing bearer token: send Authorization: Bearer <JWT> (voyager token mints one for development)")
		return
	}
	pr, err := a.auth.verify(strings.TrimSpace(raw))
	if err != nil {
		var ae *authError
		if errors.As(err, &ae) {
			c.Header("WWW-Authenticate", `Bearer realm="voyager", error="invalid_token"`)
			a.problem(c, ae.status, "Unauthorized", ae.msg)
			return
		}
		a.problem(c, http.StatusUnauthorized, "Unauthorized", "token refused")
		return
	}
	if user := c.GetHeader(OnBehalfOfHeader); user != "" {
		if !pr.serviceOnly {
			a.problem(c, http.StatusForbidden, "Forbidden", fmt.Sprintf("only a token with the %q role may act on behalf of a user (%s)", a.auth.cfg.ServiceRole, OnBehalfOfHeader))
			return
		}
		if err := state.ValidateSubject(OnBehalfOfHeader, user); err != nil {
			a.problem(c, http.StatusBadRequest, "Bad request", err.Error())
			return
		}
		if pr, err = actFor(pr, user); err != nil {
			a.problem(c, http.StatusForbidden, "Forbidden", err.Error())
			return
		}
	}
	c.Set(principalKey, pr)
	c.Next()
}

// allowService lets a service token through only when it acts for a user.
func (a *API) allowService(c *gin.Context) {
	if principalOf(c).serviceOnly {
		a.problem(c, http.StatusForbidden, "Forbidden", fmt.Sprintf("a %q token must name the user it acts for in %s", a.auth.cfg.ServiceRole, OnBehalfOfHeader))
		return
	}
	c.Next()
}

// denyService refuses service tokens: they may only act for users on
// session, profile and volume routes.
func (a *API) denyService(c *gin.Context) {
	p := principalOf(c)
	if p.serviceOnly || p.Service != "" {
		a.problem(c, http.StatusForbidden, "Forbidden", fmt.Sprintf("a %q token may only act on behalf of a user on /sessions, /profiles and /volumes, and read /nodes", a.auth.cfg.ServiceRole))
		return
	}
	c.Next()
}

func (a *API) requireAdmin(c *gin.Context) {
	if !principalOf(c).Admin {
		a.problem(c, http.StatusForbidden, "Forbidden", fmt.Sprintf("%s %s needs the %q role", c.Request.Method, c.FullPath(), a.auth.cfg.AdminRole))
		return
	}
	c.Next()
}

// rateLimit applies the per-subject token bucket.
func (a *API) rateLimit(c *gin.Context) {
	p := principalOf(c)
	key := p.Subject
	if p.Service != "" {
		key = p.Service + "/" + p.Subject
	}
	if key == "" { // a service token on its own
		key = "service:" + c.GetHeader("Authorization")
	}
	if ok, wait := a.limits.allow(key); !ok {
		c.Header("Retry-After", fmt.Sprint(int(wait/time.Second)+1))
		a.problem(c, http.StatusTooManyRequests, "Too many requests", fmt.Sprintf("more than %g requests per second (burst %d) from %s; retry after %s", a.cfg.Rate, a.cfg.Burst, p.Subject, wait.Round(time.Millisecond)))
		return
	}
	c.Next()
}

// recover turns a panic into a 500 problem and a log line.
func (a *API) recover(c *gin.Context) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			a.log.Error("api handler panicked", "path", c.Request.URL.Path, "panic", v)
			a.problem(c, http.StatusInternalServerError, "Internal error", "the server failed; the log has details")
		}
	}()
	c.Next()
}

// Whoami is GET /api/v1/whoami: who the request acts as.
type Whoami struct {
	Subject string   `json:"subject"`
	Groups  []string `json:"groups"`
	Admin   bool     `json:"admin"`
	// Service is the service token's subject when acting for Subject.
	Service string `json:"service"`
}

func (a *API) whoami(c *gin.Context) {
	p := principalOf(c)
	c.JSON(http.StatusOK, Whoami{Subject: p.Subject, Groups: p.Groups, Admin: p.Admin, Service: p.Service})
}
