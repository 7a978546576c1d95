package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// NodeSummary is a node as GET /api/v1/nodes shows it.
type NodeSummary struct {
	Name    string            `json:"name"`
	Address string            `json:"address"`
	Labels  map[string]string `json:"labels,omitempty"`
	// Simulated marks an inventory made up by configuration, not NVML.
	Simulated bool          `json:"simulated"`
	Cordon    *state.Cordon `json:"cordon,omitempty"`
	GPUs      GPUCounts     `json:"gpus"`
	// Models counts the node's GPUs by model.
	Models map[string]int `json:"models,omitempty"`
	// ModelsFree counts the free devices (as gpus.free does) by the model
	// of the GPU they are on, so a node of mixed models tells how many of
	// each are free (a JupyterHub spawner shows it where it gets no
	// devices; with ?devices=true it counts those itself).
	ModelsFree    map[string]int `json:"modelsFree,omitempty"`
	CPUMilli      int64          `json:"cpuMilli"`
	CPUUsedMilli  int64          `json:"cpuUsedMilli"`
	MemoryMiB     int64          `json:"memoryMiB"`
	MemoryUsedMiB int64          `json:"memoryUsedMiB"`
	Sessions      int            `json:"sessions"`
	Agent         string         `json:"agent,omitempty"`
	Registered    time.Time      `json:"registered"`
	// Unused lists the node's allocated GPUs that nothing runs on: no
	// process and no utilisation for longer than the agent's
	// VOYAGER_AGENT_GPU_UNUSED_AFTER, as the activity of the sessions
	// holding them reports; gpus.unused counts them. Other users'
	// sessions are anonymous except for admins.
	UnusedGPUs []UnusedGPU `json:"unusedGPUs,omitempty"`
	// Devices lists every allocatable device with its holder and use;
	// only with ?devices=true (the web console's cluster page).
	Devices []GPUDevice `json:"devices,omitempty"`
	// Problems says, for each GPU the agent offers as unhealthy, why and
	// what would mend it: "GPU <index> <uuid>: <problem>".
	Problems []string `json:"problems,omitempty"`
	// NodePower: since when the node has run nothing, and whether that is
	// long enough to power it down (nodepower.go).
	NodePower
}

// GPUCounts counts a node's allocatable GPU devices (healthy whole GPUs
// and MIG devices).
type GPUCounts struct {
	Total int `json:"total"`
	Used  int `json:"used"`
	Free  int `json:"free"`
	// Unused counts the allocated devices that nothing runs on.
	Unused int `json:"unused"`
	// Unhealthy counts the devices the agent offers as unhealthy (not in
	// total): each device's problem is in devices (?devices=true).
	Unhealthy int `json:"unhealthy,omitempty"`
}

// UnusedGPU is an allocated GPU that its session does not use.
type UnusedGPU struct {
	UUID    string `json:"uuid"`
	Session string `json:"session"`
	Owner   string `json:"owner"`
	// IdleSince is when the GPU last had a process or utilisation.
	IdleSince *time.Time `json:"idleSince,omitempty"`
}

// liveNodes returns the inventories of the registered nodes.
func (a *API) liveNodes() []state.Node {
	items := a.nodes.List()
	out := make([]state.Node, 0, len(items))
	for _, it := range items {
		if name, ok := a.keys.NodeName(it.Key); ok {
			n := it.Value
			n.Name = name
			out = append(out, n)
		}
	}
	return out
}

func (a *API) nodeSummaries() []NodeSummary {
	ledgers := a.ledgers.Snapshot()
	emptied := a.emptied.Snapshot()
	cordons := a.cordons.Snapshot()
	statuses := a.status.Snapshot()
	now := a.cfg.Now()
	var out []NodeSummary
	for _, n := range a.liveNodes() {
		s := NodeSummary{Name: n.Name, Address: n.Address, Labels: n.Labels, Simulated: n.Simulated,
			CPUMilli: n.CPUMilli, MemoryMiB: n.MemoryMiB, Agent: n.Agent, Registered: n.Registered, Models: map[string]int{}, ModelsFree: map[string]int{}}
		if c, ok := cordons.Get(a.keys.Cordon(n.Name)); ok {
			s.Cordon = &c
		}
		l, inUse := ledgers.Get(a.keys.Ledger(n.Name))
		rec, recorded := emptied.Get(a.keys.Emptied(n.Name))
		s.NodePower = a.nodePower(n, inUse, rec, recorded, now)
		owners := state.Holders(n, l) // a device whose GPU or MIG device is held is not free either
		for _, g := range n.GPUs {
			s.Models[g.Model]++
			if !g.Healthy {
				s.Problems = append(s.Problems, fmt.Sprintf("GPU %d %s: %s", g.Index, g.UUID, cmp.Or(g.Problem, "unhealthy (the agent gave no reason)")))
			}
			devs := []string{g.UUID}
			if g.MIGEnabled {
				devs = devs[:0]
				for _, m := range g.MIGDevices {
					devs = append(devs, m.UUID)
				}
			}
			for _, d := range devs {
				_, held := owners[d]
				if held {
					s.GPUs.Used++
				}
				if !g.Healthy {
					s.GPUs.Unhealthy++
				}
				if g.Healthy {
					s.GPUs.Total++
					if !held && !g.Shared { // a shared GPU is never free whole: its room is its devices' freeMiB
						s.GPUs.Free++
						s.ModelsFree[g.Model]++
					}
				}
			}
		}
		s.CPUUsedMilli, s.MemoryUsedMiB = l.Used()
		s.Sessions = len(l.Allocations)
		s.UnusedGPUs = unusedGPUs(l, func(id string) (state.Status, bool) { return statuses.Get(a.keys.Status(id)) })
		s.GPUs.Unused = len(s.UnusedGPUs)
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// unusedGPUs lists the devices of ledger l whose holder's activity flags
// them unused, in session then device order. Activity comes from the
// agent of a session's head node and covers that node's devices; a Ray
// worker's are not sampled, so never flagged.
func unusedGPUs(l state.Ledger, status func(id string) (state.Status, bool)) []UnusedGPU {
	var out []UnusedGPU
	for _, id := range sortedKeys(l.Allocations) {
		al := l.Allocations[id]
		if len(al.GPUs) == 0 {
			continue
		}
		st, ok := status(id)
		if !ok || st.Activity == nil || st.Phase.Terminal() {
			continue
		}
		held := make(map[string]bool, len(al.GPUs))
		for _, g := range al.GPUs {
			held[g] = true
		}
		for _, g := range st.Activity.GPUs {
			if g.Unused && held[g.UUID] {
				out = append(out, UnusedGPU{UUID: g.UUID, Session: id, Owner: al.Owner, IdleSince: g.IdleSince})
			}
		}
	}
	return out
}

// NodeList is GET /api/v1/nodes.
type NodeList struct {
	Items []NodeSummary `json:"items"`
}

func (a *API) listNodes(c *gin.Context) {
	out := a.nodeSummaries()
	if out == nil {
		out = []NodeSummary{}
	}
	p := principalOf(c)
	if c.Query("devices") == "true" {
		a.attachDevices(p, out)
	}
	if !p.Admin {
		for i := range out {
			for j, u := range out[i].UnusedGPUs {
				if u.Owner != p.Subject {
					out[i].UnusedGPUs[j].Session, out[i].UnusedGPUs[j].Owner = "", "(another user)"
				}
			}
		}
	}
	c.JSON(http.StatusOK, NodeList{Items: out})
}

// CordonResult answers cordon and drain: the cordon written and, for a
// drain, the notebook sessions the lifecycle controller will warn and stop
// at the deadline (batch sessions run to completion).
type CordonResult struct {
	Cordon state.Cordon `json:"cordon"`
	// Stopping lists the node's notebook sessions, which stop at the
	// drain's deadline after a warning.
	Stopping []string `json:"stopping"`
}

// UncordonResult answers uncordon.
type UncordonResult struct {
	Node        string `json:"node"`
	WasCordoned bool   `json:"wasCordoned"`
}

// CordonRequest is the optional body of cordon and drain.
type CordonRequest struct {
	Reason string `json:"reason,omitempty"`
	// Deadline (drain only) is how long notebook sessions may keep
	// running, as a Go duration such as "2h"; "0s": stop them now (each
	// still gets its warning first); absent: the cluster's drain deadline
	// (VOYAGER_DRAIN_DEADLINE, applied by the lifecycle controller).
	Deadline *state.Duration `json:"deadline,omitempty"`
}

// pathName returns the path's name, which names a record of kind what,
// or answers 422 saying why it cannot and returns false.
func (a *API) pathName(c *gin.Context, what string) (string, bool) {
	name := c.Param("name")
	if err := state.ValidateName(what, name); err != nil {
		a.invalid(c, "Invalid request", []FieldError{{Field: "path name", Message: err.Error()}})
		return "", false
	}
	return name, true
}

func (a *API) readOptionalBody(c *gin.Context, v any) bool {
	if c.Request.ContentLength == 0 {
		return true
	}
	return a.decodeBody(c, v)
}

func (a *API) cordonNode(c *gin.Context) { a.writeCordon(c, false) }
func (a *API) drainNode(c *gin.Context)  { a.writeCordon(c, true) }

// writeCordon cordons (and for drain, drains) a node. A drain is recorded
// in the cordon; the lifecycle controller warns the node's notebook
// sessions and stops them at the deadline, while batch sessions run to
// completion.
func (a *API) writeCordon(c *gin.Context, drain bool) {
	name, ok := a.pathName(c, "node name")
	if !ok {
		return
	}
	var req CordonRequest
	if !a.readOptionalBody(c, &req) {
		return
	}
	if len(req.Reason) > 256 {
		a.invalid(c, "Invalid request", []FieldError{{Field: "reason", Message: "want at most 256 characters"}})
		return
	}
	if req.Deadline != nil && (*req.Deadline < 0 || !drain) {
		a.invalid(c, "Invalid request", []FieldError{{Field: "deadline", Message: "want a duration of 0 or more, and only when draining"}})
		return
	}
	if !a.requireKnownNode(c, name) {
		return
	}
	p := principalOf(c)
	now := a.cfg.Now().UTC()
	cd := state.Cordon{Node: name, Reason: req.Reason, By: p.Subject, Since: now, Drain: drain}
	if drain && req.Deadline != nil {
		d := now.Add(req.Deadline.Std())
		cd.Deadline = &d
	}
	ctx := c.Request.Context()
	if _, err := state.Put(ctx, a.cli, a.keys.Cordon(name), cd); err != nil {
		a.internal(c, "write cordon", err)
		return
	}
	stopping := []string{}
	if drain {
		l, _, err := state.Get[state.Ledger](ctx, a.cli, a.keys.Ledger(name))
		if err != nil && !errors.Is(err, state.ErrNotFound) {
			a.internal(c, "read ledger", err)
			return
		}
		for _, id := range sortedKeys(l.Allocations) {
			if s, _, err := state.Get[state.Session](ctx, a.cli, a.keys.Session(id)); err == nil && s.Kind == state.KindNotebook && !s.Stopping() {
				stopping = append(stopping, id)
			}
		}
	}
	a.log.Info("node cordoned", "node", name, "drain", drain, "by", p.Subject, "notebooks", len(stopping))
	c.JSON(http.StatusOK, CordonResult{Cordon: cd, Stopping: stopping})
}

func (a *API) uncordonNode(c *gin.Context) {
	name, ok := a.pathName(c, "node name")
	if !ok {
		return
	}
	resp, err := a.cli.Delete(c.Request.Context(), a.keys.Cordon(name))
	if err != nil {
		a.internal(c, "delete cordon", err)
		return
	}
	a.log.Info("node uncordoned", "node", name, "by", principalOf(c).Subject)
	c.JSON(http.StatusOK, UncordonResult{Node: name, WasCordoned: resp.Deleted > 0})
}

// QueueEntry is one line of GET /api/v1/queue.
type QueueEntry struct {
	// Position is the 1-based place among waiting sessions; 0 for a
	// session the placer can bind on its next pass.
	Position int `json:"position"`
	// Session and Owner are shown for the caller's own entries (all, for
	// admins); others' are "(another user)".
	Session  string    `json:"session"`
	Owner    string    `json:"owner"`
	Mine     bool      `json:"mine"`
	Priority int       `json:"priority"`
	Request  string    `json:"request"`
	Reason   string    `json:"reason"`
	Message  string    `json:"message"`
	Waiting  string    `json:"waiting"`
	Created  time.Time `json:"created"`
	// Estimate is, for the caller's own waiting entries, when it could
	// start at the earliest.
	Estimate *QueueEstimate `json:"estimate,omitempty"`
}

// QueueView is GET /api/v1/queue.
type QueueView struct {
	Items []QueueEntry `json:"items"`
	// Mine counts the caller's entries; Total all of them.
	Mine  int `json:"mine"`
	Total int `json:"total"`
}

// queuePlan is the placer's plan over the caches, memoised.
type queuePlan struct {
	plan *placer.Plan
	// waiting indexes plan.Waiting by session id: at 70,000 waiting an
	// index map is 3.5 MB a plan, a map of copies was 9.4 MB.
	waiting map[string]int32
	// revs are the revisions of the caches it was planned from (pending,
	// nodes, ledgers, cordons, quotas, teams, gpuhours, runtimes); at is
	// when, took how long it took.
	revs     [8]int64
	at       time.Time
	took     time.Duration
	finished time.Time
}

// planCache holds the latest queue plan. Requests read it; they never wait
// for a plan that takes long (see queuePlan).
type planCache struct {
	mu         sync.Mutex
	cur        *queuePlan
	refreshing bool
	// nodes keeps each node's planning state between queue plans, rebuilt
	// only where its node key or ledger moved (placer.PlanCache): at a
	// large site most of a plan's nodes are as the last plan saw them.
	nodes *placer.PlanCache
}

// syncPlanBudget is the longest a plan may have taken for a request to
// plan again itself when the plan is stale. A plan that took longer (a
// large queue on many nodes: hundreds of milliseconds at 10,000 nodes) is
// planned again in the background and requests answer from the last one.
const syncPlanBudget = 20 * time.Millisecond

// queuePlan returns the placer's plan of the queue over the caches. A plan
// is stale when a cache it read moved or a second has passed (waiting ages
// change reasons). A stale plan that was cheap is planned again at once,
// unless it finished less than three of its durations ago (requests then
// share it, so planning takes at most a quarter of the time however fast
// creates come), so a lightly used cluster always answers from current
// caches; a stale plan that was not cheap is served as it is while one
// background pass plans again, at most once per second and at most once
// in three times its own duration (planning takes at most a third of a
// core): queue positions at a large site are a few passes old at most, and
// no request pays for a plan.
func (a *API) queuePlan() *queuePlan {
	revs := [8]int64{a.pending.Revision(), a.nodes.Revision(), a.ledgers.Revision(), a.cordons.Revision(), a.quotas.Revision(), a.teams.Revision(), a.daysRevision(), a.runtimesRevision()}
	pc := &a.plans
	pc.mu.Lock()
	now := a.cfg.Now()
	cur := pc.cur
	if cur != nil && (cur.revs == revs && now.Sub(cur.at) < time.Second) {
		pc.mu.Unlock()
		return cur
	}
	if cur != nil && cur.took <= syncPlanBudget && time.Since(cur.finished) < 3*cur.took {
		// Cheap, but planned again moments ago: while requests come
		// faster than one in three plan durations (creates move the
		// queue with every request), each would plan again in turn
		// behind this lock, and planning would take the cores. The
		// plan served is at most three of its durations old.
		pc.mu.Unlock()
		return cur
	}
	if cur != nil && cur.took > syncPlanBudget {
		if !pc.refreshing && time.Since(cur.finished) >= max(time.Second, 3*cur.took) {
			pc.refreshing = true
			go func() {
				qp := a.planQueue(revs)
				pc.mu.Lock()
				pc.cur, pc.refreshing = qp, false
				pc.mu.Unlock()
			}()
		}
		pc.mu.Unlock()
		return cur
	}
	defer pc.mu.Unlock()
	qp := a.planQueue(revs)
	pc.cur = qp
	return qp
}

// planQueue plans the queue over the caches, which were at revs or later.
func (a *API) planQueue(revs [8]int64) *queuePlan {
	now := a.cfg.Now()
	start := time.Now()
	snap := a.snapshot(now)
	snap.Cache = a.plans.nodes
	p := placer.NewPlan(snap, a.cfg.Plan)
	qp := &queuePlan{plan: p, waiting: make(map[string]int32, len(p.Waiting)), revs: revs, at: now}
	for i, w := range p.Waiting {
		qp.waiting[w.Pending.Entry.Session] = int32(i)
	}
	qp.finished = time.Now()
	qp.took = qp.finished.Sub(start)
	a.metrics.observePlan(qp.took)
	return qp
}

// snapshot builds a planning snapshot from the caches, exactly as the
// placer does: with the teams' decayed usage when a half-life is set
// (queuedecay.go), and the owners' recent run times when run-time
// estimates are on (queueruntimes.go).
func (a *API) snapshot(now time.Time) *placer.Snapshot {
	s := placer.SnapshotOf(a.keys, placer.Caches{
		Nodes: a.nodes.Snapshot(), Ledgers: a.ledgers.Snapshot(), Cordons: a.cordons.Snapshot(),
		Quotas: a.quotas.Snapshot(), Pending: a.pending.Snapshot(), Teams: a.teams.Snapshot(),
	}, now)
	s.TeamUsage = a.teamUsage(now)
	s.Runtimes = a.runtimeRecords()
	return s
}

func (a *API) queue(c *gin.Context) {
	p := principalOf(c)
	qp := a.queuePlan()
	now := a.cfg.Now()
	out := []QueueEntry{}
	entry := func(e state.QueueEntry, pos int, reason, msg string) QueueEntry {
		q := QueueEntry{Position: pos, Session: e.Session, Owner: e.Owner, Mine: e.Owner == p.Subject, Priority: e.Priority,
			Request: describeRequest(e), Reason: reason, Message: msg, Waiting: now.Sub(e.Created).Round(time.Second).String(), Created: e.Created}
		if !q.Mine && !p.Admin {
			q.Session, q.Owner = "", "(another user)"
		}
		return q
	}
	for _, d := range qp.plan.Bound {
		out = append(out, entry(*d.Pending.Entry, 0, "Placing", "fits now: the placer binds it on its next pass"))
	}
	est := a.newEstimator()
	for _, w := range qp.plan.Waiting {
		q := entry(*w.Pending.Entry, w.Position, w.Reason, w.Message)
		if q.Mine {
			q.Estimate = est.estimate(*w.Pending.Entry, w.Position)
		}
		out = append(out, q)
	}
	mine := 0
	for _, q := range out {
		if q.Mine {
			mine++
		}
	}
	c.JSON(http.StatusOK, QueueView{Items: out, Mine: mine, Total: len(out)})
}

func describeRequest(e state.QueueEntry) string {
	var parts []string
	for i, r := range e.Parts() {
		s := fmt.Sprintf("%d GPU", r.GPUs)
		if r.GPUModel != "" {
			s += " " + r.GPUModel
		}
		if r.MIGProfile != "" {
			s += " MIG " + r.MIGProfile
		}
		if r.Fraction() {
			s = shareWords(r)
		}
		s += fmt.Sprintf(", %g CPU, %d MiB", float64(r.CPUMilli)/1000, r.MemoryMiB)
		if i == 0 && len(e.Parts()) > 1 {
			s = "head " + s
		} else if i > 0 {
			s = "worker " + s
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// Profiles and quotas.

func (a *API) listProfiles(c *gin.Context) {
	resp, err := a.cli.Get(c.Request.Context(), a.keys.Profiles(), clientv3.WithPrefix())
	if err != nil {
		a.internal(c, "list profiles", err)
		return
	}
	out := []state.Profile{}
	for _, kv := range resp.Kvs {
		if p, err := state.Decode[state.Profile](kv.Value); err == nil {
			out = append(out, p)
		}
	}
	c.JSON(http.StatusOK, ProfileList{Items: out})
}

// ProfileList is GET /api/v1/profiles.
type ProfileList struct {
	Items []state.Profile `json:"items"`
}

func (a *API) getProfile(c *gin.Context) {
	name := c.Param("name")
	if state.ValidateName("profile", name) != nil {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no profile %q", truncate(name, 64)))
		return
	}
	p, _, err := state.Get[state.Profile](c.Request.Context(), a.cli, a.keys.Profile(name))
	switch {
	case errors.Is(err, state.ErrNotFound):
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no profile %q", name))
	case err != nil:
		a.internal(c, "read profile", err)
	default:
		c.JSON(http.StatusOK, p)
	}
}

func (a *API) putProfile(c *gin.Context) {
	name, ok := a.pathName(c, "profile")
	if !ok {
		return
	}
	var p state.Profile
	if !a.decodeBody(c, &p) {
		return
	}
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if p.Name != "" && p.Name != name {
		add("name", "got %q, want %q (the name in the path) or empty", p.Name, name)
	}
	p.Name = name
	switch p.Kind {
	case "", state.KindNotebook, state.KindBatch:
	default:
		add("kind", `got %q, want "notebook", "batch" or empty`, p.Kind)
	}
	if len(p.Description) > 256 {
		add("description", "want at most 256 characters")
	}
	if p.Image != "" && !imageRE.MatchString(p.Image) {
		add("image", "got %q, want an image reference such as docker.io/library/python:3.12", truncate(p.Image, 80))
	}
	validateResources("resources", p.Resources, add)
	validateEgress("egress", p.Egress, add)
	a.validateProfileResources(c.Request.Context(), p, add)
	for _, k := range sortedKeys(p.Env) {
		if !envNameRE.MatchString(k) {
			add("env."+k, "want a variable name of letters, digits and '_', not starting with a digit")
		}
	}
	if p.Limits.MaxRuntime < 0 || p.Limits.IdleTimeout < 0 {
		add("limits", "want durations of 0 or more")
	}
	if capd := a.cfg.MaxRuntimeCap; capd > 0 && p.Limits.MaxRuntime.Std() > capd {
		add("limits.maxRuntime", "got %s, above the cluster's cap of %s (VOYAGER_MAX_RUNTIME_CAP); want at most %s", p.Limits.MaxRuntime.Std(), capd, capd)
	}
	a.profileUsable(p, errs, add)
	if len(errs) > 0 {
		a.invalid(c, "Invalid request", errs)
		return
	}
	if _, err := state.Put(c.Request.Context(), a.cli, a.keys.Profile(name), p); err != nil {
		a.internal(c, "write profile", err)
		return
	}
	c.JSON(http.StatusOK, p)
}

// validateProfileResources checks a profile's shm sizes, ulimits (against
// the cluster's caps) and volumes (names, mount paths, and that each
// exists); add receives each problem.
func (a *API) validateProfileResources(ctx context.Context, p state.Profile, add func(field, format string, args ...any)) {
	switch {
	case p.ShmMiB < 0:
		add("shmMiB", "got %d, want 0 (the cluster default) or MiB above 0, e.g. 16384", p.ShmMiB)
	case p.MaxShmMiB < 0:
		add("maxShmMiB", "got %d, want 0 (no cap but the session's memory) or MiB above 0", p.MaxShmMiB)
	case p.MaxShmMiB > 0 && p.ShmMiB > p.MaxShmMiB:
		add("shmMiB", "got %d MiB, above the profile's maxShmMiB (%d); want at most %d, or a larger maxShmMiB", p.ShmMiB, p.MaxShmMiB, p.MaxShmMiB)
	case p.Resources.MemoryMiB > 0 && p.ShmMiB > p.Resources.MemoryMiB:
		add("shmMiB", "got %d MiB, above the profile's resources.memoryMiB (%d): /dev/shm counts against the session's memory; want at most %d, or more memoryMiB", p.ShmMiB, p.Resources.MemoryMiB, p.Resources.MemoryMiB)
	}
	if p.Ulimits != nil {
		a.admission().overlayUlimits(&state.Ulimits{}, *p.Ulimits, add)
	}
	if len(p.Volumes) > maxVolumes {
		add("volumes", "has %d volumes, want at most %d", len(p.Volumes), maxVolumes)
		return
	}
	asks := make([]volumeAsk, len(p.Volumes))
	for j, v := range p.Volumes {
		asks[j] = volumeAsk{VolumeRef: v, field: fmt.Sprintf("volumes[%d]", j), profile: p.Name}
	}
	validateVolumeRequests(asks, add)
	for _, v := range asks {
		if state.ValidateName("volume", v.Name) != nil {
			continue
		}
		if _, _, err := state.Get[state.Volume](ctx, a.cli, a.keys.Volume(v.Name)); errors.Is(err, state.ErrNotFound) {
			add(v.field+".name", "no volume %q; define it first (PUT /api/v1/volumes/%s), or GET /api/v1/volumes lists them", v.Name, v.Name)
		} else if err != nil {
			add(v.field+".name", "could not read volume %q: %v; try again", v.Name, err)
		}
	}
}

func (a *API) deleteProfile(c *gin.Context) {
	a.deleteNamed(c, "profile", a.keys.Profile)
}

// QuotaList is GET /api/v1/quotas: quotas by user and by group.
type QuotaList struct {
	Users  map[string]state.Quota `json:"users"`
	Groups map[string]state.Quota `json:"groups"`
}

func (a *API) listQuotas(c *gin.Context) {
	resp, err := a.cli.Get(c.Request.Context(), a.keys.Quotas(), clientv3.WithPrefix())
	if err != nil {
		a.internal(c, "list quotas", err)
		return
	}
	out := QuotaList{Users: map[string]state.Quota{}, Groups: map[string]state.Quota{}}
	for _, kv := range resp.Kvs {
		scope, name, ok := a.keys.QuotaKey(string(kv.Key))
		q, err := state.Decode[state.Quota](kv.Value)
		if !ok || err != nil {
			continue
		}
		if scope == state.QuotaUsers {
			out.Users[name] = q
		} else {
			out.Groups[name] = q
		}
	}
	c.JSON(http.StatusOK, out)
}

func (a *API) quotaKey(c *gin.Context) (string, bool) {
	scope, name := state.QuotaScope(c.Param("scope")), c.Param("name")
	var errs []FieldError
	if scope != state.QuotaUsers && scope != state.QuotaGroups {
		errs = append(errs, FieldError{Field: "path scope", Message: fmt.Sprintf("got %q, want users or groups", scope)})
	}
	if err := state.ValidateSubject("name", name); err != nil {
		errs = append(errs, FieldError{Field: "path name", Message: err.Error()})
	}
	if len(errs) > 0 {
		a.invalid(c, "Invalid request", errs)
		return "", false
	}
	if scope == state.QuotaUsers {
		return a.keys.UserQuota(name), true
	}
	return a.keys.GroupQuota(name), true
}

func (a *API) putQuota(c *gin.Context) {
	key, ok := a.quotaKey(c)
	if !ok {
		return
	}
	var q state.Quota
	if !a.decodeBody(c, &q) {
		return
	}
	var errs []FieldError
	for _, f := range []struct {
		name string
		v    *int64
	}{{"gpus", q.GPUs}, {"cpuMilli", q.CPUMilli}, {"memoryMiB", q.MemoryMiB}} {
		if f.v != nil && *f.v < 0 {
			errs = append(errs, FieldError{Field: f.name, Message: fmt.Sprintf("got %d, want 0 or more (leave it out for no limit)", *f.v)})
		}
	}
	if q.Weight != nil && !(*q.Weight > 0 && *q.Weight <= 1e6) {
		errs = append(errs, FieldError{Field: "weight", Message: fmt.Sprintf("got %v, want a fair-share weight above 0 and at most 1000000 (leave it out for 1)", *q.Weight)})
	}
	if len(errs) > 0 {
		a.invalid(c, "Invalid request", errs)
		return
	}
	if _, err := state.Put(c.Request.Context(), a.cli, key, q); err != nil {
		a.internal(c, "write quota", err)
		return
	}
	c.JSON(http.StatusOK, q)
}

func (a *API) deleteQuota(c *gin.Context) {
	key, ok := a.quotaKey(c)
	if !ok {
		return
	}
	resp, err := a.cli.Delete(c.Request.Context(), key)
	if err != nil {
		a.internal(c, "delete quota", err)
		return
	}
	if resp.Deleted == 0 {
		a.problem(c, http.StatusNotFound, "Not found", "no such quota")
		return
	}
	c.Status(http.StatusNoContent)
}
