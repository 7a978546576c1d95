package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/state"
)

// specFlags are the flags that describe a session, shared by
// `voyager session create` and `voyager run`.
type specFlags struct {
	kind, name, profile, image string
	gpus, gpusMax              int // gpusMax > 0: an elastic range --gpus gpus-gpusMax
	gpuModel, mig              string
	gpuMemory, memory          int64
	gpuShare                   int64
	gpuCompute                 int
	cpu                        float64
	env                        []string
	rayWorkers                 int
	nodes, nodesMax            int // nodesMax > 0: an elastic range --nodes nodes-nodesMax
	onPartFailure              string
	maxRuntime, idleTimeout    time.Duration
	priority                   int
	team                       string
	preemptible                bool
	restart                    string
	maxRestarts                int
	idempotencyKey             string
	denyEgress                 bool
	egressAllow                []string
	shmMiB                     int64
	ulimits, volumes           []string
}

func (s *specFlags) register(cmd *cobra.Command, withKind bool) {
	fs := cmd.Flags()
	if withKind {
		fs.StringVar(&s.kind, "kind", "notebook", "notebook or batch")
		_ = cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions([]cobra.Completion{"notebook", "batch"}, cobra.ShellCompDirectiveNoFileComp))
	}
	fs.StringVar(&s.name, "name", "", "a label for the session")
	fs.StringVar(&s.profile, "profile", "", "an admin-defined profile (GET /api/v1/profiles)")
	fs.StringVar(&s.image, "image", "", "container image (unless the profile sets one); default: the agent's VOYAGER_AGENT_IMAGE")
	fs.Var(&gpuRange{&s.gpus, &s.gpusMax}, "gpus", "whole GPUs (or MIG devices with --mig); MIN-MAX, e.g. 2-8, for an elastic batch job that grows and shrinks with the cluster's load (restarted at each new size)")
	fs.StringVar(&s.gpuModel, "gpu-model", "", `GPU model pattern, e.g. "*A100*"`)
	fs.Int64Var(&s.gpuMemory, "gpu-memory", 0, "least memory per GPU, MiB")
	fs.StringVar(&s.mig, "mig", "", "MIG profile, e.g. 1g.10gb")
	fs.Int64Var(&s.gpuShare, "gpu-share", 0, "a fraction of one shared GPU: this much of its memory, MiB (instead of --gpus; --gpu-memory still picks GPUs by size)")
	fs.IntVar(&s.gpuCompute, "gpu-compute", 0, "with --gpu-share: the fraction's share of the GPU's compute, percent (default: no cap of its own)")
	fs.Float64Var(&s.cpu, "cpu", 0, "CPU cores (default 1 with GPUs, 0.5 without)")
	fs.Int64Var(&s.memory, "memory", 0, "memory in MiB (default 4096 with GPUs, 1024 without)")
	fs.StringArrayVar(&s.env, "env", nil, "KEY=VALUE for the container's environment (repeatable)")
	fs.IntVar(&s.rayWorkers, "ray-workers", 0, "Ray workers on more nodes")
	fs.Var(nodeCount{&s.nodes, &s.nodesMax}, "nodes", "machines of a multi-node batch job (torchrun, DeepSpeed, MPI): one part on each, with these resources; MIN-MAX, e.g. 1-4, for an elastic one that grows and shrinks by whole machines (restarted at each new count)")
	fs.StringVar(&s.onPartFailure, "on-part-failure", "", "what a multi-node job does when one part fails: StopAll (default) or Continue")
	_ = cmd.RegisterFlagCompletionFunc("on-part-failure", cobra.FixedCompletions([]cobra.Completion{state.PartFailureStopAll, state.PartFailureContinue}, cobra.ShellCompDirectiveNoFileComp))
	fs.DurationVar(&s.maxRuntime, "max-runtime", 0, "stop after this long running (0: no limit)")
	fs.DurationVar(&s.idleTimeout, "idle-timeout", 0, "stop a notebook idle this long (0: cluster default)")
	fs.IntVar(&s.priority, "priority", 0, "queue priority, -100 to 100, at most your team's maximum (voyager team list)")
	fs.StringVar(&s.team, "team", "", "the team to charge: one of yours (voyager team list; default: your first)")
	fs.BoolVar(&s.preemptible, "preemptible", false, "may be stopped for higher-priority sessions")
	fs.StringVar(&s.restart, "restart", "", "restart policy of batch sessions: Never or OnFailure")
	_ = cmd.RegisterFlagCompletionFunc("restart", cobra.FixedCompletions([]cobra.Completion{"Never", "OnFailure"}, cobra.ShellCompDirectiveNoFileComp))
	fs.IntVar(&s.maxRestarts, "max-restarts", 0, "restarts allowed with --restart OnFailure")
	fs.BoolVar(&s.denyEgress, "deny-egress", false, "the session opens no connection but to --egress-allow networks (a profile may deny egress for you)")
	fs.StringArrayVar(&s.egressAllow, "egress-allow", nil, "an IPv4 network (CIDR) a session with denied egress still reaches, e.g. 10.20.0.0/16 (repeatable; implies --deny-egress)")
	fs.StringVar(&s.idempotencyKey, "idempotency-key", "", "makes a retried create return the first session (or array, with -array/-params) instead of a second (default: a random key per invocation)")
	fs.Int64Var(&s.shmMiB, "shm", 0, "/dev/shm in MiB, at most --memory and the profile's maxShmMiB (default: the profile's, else the cluster's, at most half of --memory)")
	fs.StringArrayVar(&s.ulimits, "ulimit", nil, "nofile=N or memlock=KiB|unlimited, up to the cluster's limits (repeatable; default: the profile's, else the cluster's)")
	fs.StringArrayVar(&s.volumes, "volume", nil, "`NAME:/mount/path[:ro]`: a volume (voyager volume list) mounted at /mount/path, read-only with :ro, besides the profile's (repeatable; naming a profile's volume moves it)")
}

// parseVolume reads --volume NAME:/mount/path[:ro].
func parseVolume(v string) (api.VolumeRequest, error) {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" || (len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw") {
		return api.VolumeRequest{}, fmt.Errorf("invalid --volume %q: want NAME:/mount/path, or NAME:/mount/path:ro for read-only", v)
	}
	return api.VolumeRequest{Name: parts[0], MountPath: parts[1], ReadOnly: len(parts) == 3 && parts[2] == "ro"}, nil
}

// parseUlimit reads --ulimit nofile=N or memlock=KiB|unlimited into u.
func parseUlimit(u *state.Ulimits, v string) error {
	k, val, _ := strings.Cut(v, "=")
	n, err := strconv.ParseInt(val, 10, 64)
	switch {
	case k == "memlock" && val == "unlimited":
		u.MemlockKiB = state.UlimitUnlimited
	case k == "memlock" && err == nil && n > 0:
		u.MemlockKiB = n
	case k == "nofile" && err == nil && n > 0:
		u.Nofile = n
	default:
		return fmt.Errorf("invalid --ulimit %q: want nofile=N or memlock=KiB (or memlock=unlimited)", v)
	}
	return nil
}

// request builds the create request; command may be empty.
func (s *specFlags) request(command []string) (api.SessionRequest, error) {
	r := api.SessionRequest{
		Kind: state.SessionKind(s.kind), Name: s.name, Profile: s.profile, Image: s.image,
		Command: command, Priority: s.priority, Preemptible: s.preemptible, Team: s.team,
		Nodes: s.nodes, OnPartFailure: s.onPartFailure,
	}
	if s.gpus != 0 || s.gpuModel != "" || s.gpuMemory != 0 || s.mig != "" || s.gpuShare != 0 || s.gpuCompute != 0 || s.cpu != 0 || s.memory != 0 || s.profile == "" {
		r.Resources = &state.Resources{GPUs: s.gpus, GPUModel: s.gpuModel, GPUMemoryMiB: s.gpuMemory, MIGProfile: s.mig,
			GPUShareMiB: s.gpuShare, GPUComputePercent: s.gpuCompute, CPUMilli: int64(s.cpu * 1000), MemoryMiB: s.memory}
		if s.gpuShare != 0 && s.gpus == 0 {
			r.Resources.GPUs = 1 // a fraction is of one GPU
		}
	}
	for _, kv := range s.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return r, fmt.Errorf("invalid --env %q: want KEY=VALUE", kv)
		}
		if r.Env == nil {
			r.Env = map[string]string{}
		}
		r.Env[k] = v
	}
	if s.rayWorkers > 0 {
		r.Ray = &state.Ray{Workers: s.rayWorkers}
	}
	if s.gpusMax > 0 {
		r.Elastic = &api.ElasticRequest{Min: s.gpus, Max: s.gpusMax}
	}
	if s.nodesMax > 0 {
		if r.Elastic == nil {
			r.Elastic = &api.ElasticRequest{}
		}
		r.Nodes, r.Elastic.MinNodes, r.Elastic.MaxNodes = 0, s.nodes, s.nodesMax
	}
	if s.maxRuntime != 0 || s.idleTimeout != 0 {
		r.Limits = &state.Limits{MaxRuntime: state.Duration(s.maxRuntime), IdleTimeout: state.Duration(s.idleTimeout)}
	}
	if s.restart != "" || s.maxRestarts != 0 {
		r.Restart = &state.RestartPolicy{Policy: s.restart, MaxRestarts: s.maxRestarts}
	}
	if s.denyEgress || len(s.egressAllow) > 0 {
		r.Egress = &state.Egress{Deny: true, Allow: s.egressAllow}
	}
	r.ShmMiB = s.shmMiB
	for _, u := range s.ulimits {
		if r.Ulimits == nil {
			r.Ulimits = &state.Ulimits{}
		}
		if err := parseUlimit(r.Ulimits, u); err != nil {
			return r, err
		}
	}
	for _, v := range s.volumes {
		vr, err := parseVolume(v)
		if err != nil {
			return r, err
		}
		r.Volumes = append(r.Volumes, vr)
	}
	return r, nil
}

// create submits r with an idempotency key, so a retry after a lost
// answer never makes a second session.
func create(ctx context.Context, c *client, r api.SessionRequest, key string) (api.SessionView, error) {
	var v api.SessionView
	err := postIdempotent(ctx, c, "/api/v1/sessions", r, key, &v)
	return v, err
}

// postIdempotent POSTs body to path with an Idempotency-Key header (key,
// or a random one) and decodes the answer into out. It retries a lost
// connection and a 503 with the same key, so the create it asks for is
// made once however many times it is sent.
func postIdempotent(ctx context.Context, c *client, path string, body any, key string, out any) error {
	if key == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		key = hex.EncodeToString(b)
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		hr, rerr := c.request(ctx, "POST", path, body, map[string]string{api.IdempotencyKeyHeader: key})
		if rerr == nil {
			err = decodeJSON(hr.Body, out)
			hr.Body.Close()
			return err
		}
		err = rerr
		var ae *apiError
		// The API answered: retrying gives the same answer, except a 503
		// (etcd did not answer, e.g. while it elects a leader).
		if (errors.As(rerr, &ae) && ae.status != http.StatusServiceUnavailable) || ctx.Err() != nil {
			return err
		}
		select { // the same key makes the retry safe
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt+1) * 500 * time.Millisecond):
		}
	}
	return err
}

const sessionLong = `Manages your sessions over the HTTP API: create one, list them, read one,
stop it, extend its max runtime, read its output, wait for a phase.`

func newSessionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "session",
		Aliases: []string{"sessions"},
		Short:   "Create, list, get, stop, wait for sessions and read their logs",
		Long:    sessionLong,
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(newSessionCreateCmd(), newSessionListCmd(), newSessionGetCmd(), newSessionStopCmd(),
		newSessionExtendCmd(), newSessionLogsCmd(), newSessionWaitCmd(), newSessionExecCmd(), newSessionPortForwardCmd())
	return cmd
}

func newSessionCreateCmd() *cobra.Command {
	var cf clientFlags
	var spec specFlags
	cmd := &cobra.Command{
		Use:   "create [flags] [-- COMMAND ARGS…]",
		Short: "Submit a session (a notebook by default) and print it",
		Long: `Submits a session and prints it. Without a command a notebook runs the
image's Jupyter; a batch session (--kind batch) needs one, after --.`,
		Example: `  voyager session create --gpus 1 --image voyager.local/jupyter:latest
  voyager session create --kind batch --gpus 2 -- python train.py`,
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			r, err := spec.request(args)
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", cmd.CommandPath(), err)
				return exitCode(exitUsage)
			}
			v, err := create(cmd.Context(), c, r, spec.idempotencyKey)
			if err != nil {
				return cliError(cmd, err)
			}
			return cf.show(cmd.OutOrStdout(), v, func(w io.Writer, _ bool) { writeSession(w, v) })
		}),
	}
	cf.register(cmd, true)
	spec.register(cmd, true)
	return cmd
}

func newSessionListCmd() *cobra.Command {
	var (
		cf           clientFlags
		wf           watchFlags
		phase, owner string
		limit        int
		all          bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List your sessions (admins: anyone's with --owner)",
		Long:    "Lists sessions, oldest first. --watch then prints each session again when it changes.",
		Args:    cobra.NoArgs,
		RunE: listRunE(&cf, &wf, func(cmd *cobra.Command, c *client) listing[api.SessionView] {
			return sessionListing(c, phase, owner, limit, all || wf.watch, cmd.ErrOrStderr(), cf.structured())
		}),
	}
	cf.register(cmd, true)
	wf.register(cmd)
	cmd.Flags().StringVar(&phase, "phase", "", "only sessions in this phase")
	cmd.Flags().StringVar(&owner, "owner", "", "only this owner's (admins)")
	cmd.Flags().IntVar(&limit, "limit", 50, "sessions per page")
	cmd.Flags().BoolVar(&all, "all", false, "fetch every page")
	_ = cmd.RegisterFlagCompletionFunc("phase", cobra.FixedCompletions(phaseNames(), cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// phaseNames are the session phases, for completion.
func phaseNames() []cobra.Completion {
	return []cobra.Completion{
		string(state.PhasePending), string(state.PhaseBound), string(state.PhaseStarting), string(state.PhaseRunning),
		string(state.PhaseSucceeded), string(state.PhaseFailed), string(state.PhaseStopping), string(state.PhaseStopped),
		string(state.PhaseLost),
	}
}

// sessionListing reads sessions page by page (every page when all).
func sessionListing(c *client, phase, owner string, limit int, all bool, stderr io.Writer, quiet bool) listing[api.SessionView] {
	return listing[api.SessionView]{
		fetch: func(ctx context.Context) ([]api.SessionView, error) {
			var items []api.SessionView
			q := url.Values{}
			if phase != "" {
				q.Set("phase", phase)
			}
			if owner != "" {
				q.Set("owner", owner)
			}
			q.Set("limit", itoa(limit))
			for {
				var page api.SessionList
				if err := c.do(ctx, "GET", "/api/v1/sessions?"+q.Encode(), nil, &page); err != nil {
					return nil, err
				}
				items = append(items, page.Items...)
				if page.Continue == "" || !all {
					if page.Continue != "" && !quiet {
						fmt.Fprintln(stderr, "(more: use --all)")
					}
					return items, nil
				}
				q.Set("continue", page.Continue)
			}
		},
		key: func(s api.SessionView) string { return s.ID },
		header: func(wide bool) string {
			if wide {
				return "ID\tOWNER\tKIND\tGPUS\tPHASE\tREASON\tAGE\tNODES\tIMAGE\tNAME\tURL"
			}
			return "ID\tOWNER\tKIND\tGPUS\tPHASE\tREASON\tAGE"
		},
		row: func(s api.SessionView, wide bool) string {
			r := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", s.ID, s.Owner, s.Kind, gpuText(s.Resources), s.Status.Phase, s.Status.Reason, age(s.Created))
			if wide {
				var u string
				if ks := sortedMapKeys(s.Status.URLs); len(ks) > 0 {
					u = s.Status.URLs[ks[0]]
				}
				r += fmt.Sprintf("\t%s\t%s\t%s\t%s", dash(strings.Join(s.Status.Nodes, ",")), dash(s.Image), dash(s.Name), dash(u))
			}
			return r
		},
		comparable: func(s api.SessionView) api.SessionView {
			s.Status.Activity = nil // sampled every few seconds: not a change to show
			return s
		},
	}
}

// dash stands in for an empty table cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newSessionGetCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Print a session's spec and status",
		Long: `Prints a session's spec and status, with any warning that the system will
stop it, its last activity and its GPUs' use.`,
		Args:              exactArgs(1),
		ValidArgsFunction: completeSessionIDs(&cf),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			return callShow(cmd, c, &cf, "GET", "/api/v1/sessions/"+url.PathEscape(args[0]), nil, writeSession)
		}),
	}
	cf.register(cmd, true)
	return cmd
}

func newSessionStopCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "stop ID…",
		Short: "Stop sessions (a pending one is cancelled)",
		Long: `Stops each session named: a pending one is cancelled at once, a running one
is stopped by its node agent. Every ID is tried; the exit code is 1 if
any could not be stopped (each such one says why on stderr).`,
		Args:              minArgsWithHint(1, "want the ID of at least one session to stop: voyager session stop ID…"),
		ValidArgsFunction: completeSessionIDs(&cf),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			return stopSessions(cmd, c, &cf, args)
		}),
	}
	cf.register(cmd, true)
	return cmd
}

func newSessionExtendCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "extend ID DURATION",
		Short: "Let a session run DURATION longer than its max runtime",
		Long: `Extends a session's max runtime by DURATION (a Go duration such as 2h or
90m): its limit becomes the one that applies now (its own, else the
cluster's VOYAGER_MAX_RUNTIME) plus DURATION, up to the cluster's cap
(VOYAGER_MAX_RUNTIME_CAP). A max runtime warning is withdrawn once the new
limit moves the stop beyond the warning window.`,
		Args:              exactArgs(2),
		ValidArgsFunction: completeSessionIDs(&cf),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			id := args[0]
			by, err := time.ParseDuration(args[1])
			if err != nil || by <= 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: invalid duration %q: want a positive Go duration such as 2h or 90m\n", cmd.CommandPath(), args[1])
				return exitCode(exitUsage)
			}
			var v api.SessionView
			if err := c.do(cmd.Context(), "POST", "/api/v1/sessions/"+url.PathEscape(id)+"/extend", api.ExtendRequest{By: state.Duration(by)}, &v); err != nil {
				return cliError(cmd, err)
			}
			return cf.show(cmd.OutOrStdout(), v, func(w io.Writer, _ bool) {
				msg := fmt.Sprintf("%s: max runtime now %s", id, v.Limits.MaxRuntime.Std())
				if v.RunsUntil != nil {
					msg += ", runs until " + v.RunsUntil.UTC().Format(timeLayout)
				}
				fmt.Fprintln(w, msg)
			})
		}),
	}
	cf.register(cmd, true)
	return cmd
}

func newSessionLogsCmd() *cobra.Command {
	var (
		cf     clientFlags
		follow bool
		tail   int
	)
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a session's container output",
		Long: `Prints a session's container output (of its current attempt). --follow
keeps streaming until the session ends: when a failed session restarts
(--restart OnFailure), the next attempt's output follows, each attempt
headed by a line "==> attempt N of session ID <==".`,
		Args:              exactArgs(1),
		ValidArgsFunction: completeSessionIDs(&cf),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			w := cmd.OutOrStdout()
			var err error
			if follow {
				err = c.followLogs(cmd.Context(), args[0], tail, w, func(attempt int) {
					fmt.Fprintf(w, "==> attempt %d of session %s <==\n", attempt+1, args[0])
				}, nil)
			} else {
				err = c.logs(cmd.Context(), args[0], tail, false, w)
			}
			if err != nil && cmd.Context().Err() == nil {
				return cliError(cmd, err)
			}
			return nil
		}),
	}
	cf.register(cmd, false)
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming until the container exits")
	cmd.Flags().IntVar(&tail, "tail", 0, "only the last N lines (0: all)")
	return cmd
}

func newSessionWaitCmd() *cobra.Command {
	var (
		cf      clientFlags
		waitFor string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Wait until a session is Running (or any phase), printing each change",
		Long: `Waits until a session reaches a phase (Running unless --for says another,
or "end" for any terminal phase), printing each change and warning on
stderr. Exits 1 if it ends without reaching it.`,
		Args:              exactArgs(1),
		ValidArgsFunction: completeSessionIDs(&cf),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			return withCode(waitSession(cmd.Context(), c, args[0], waitFor, timeout, &cf, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		}),
	}
	cf.register(cmd, true)
	cmd.Flags().StringVar(&waitFor, "for", "Running", `phase to wait for, or "end" for any terminal phase`)
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (0: never)")
	_ = cmd.RegisterFlagCompletionFunc("for", cobra.FixedCompletions(append(phaseNames(), "end"), cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// completeSessionIDs completes a session ID argument with the caller's
// sessions, asked of the API (with the token and URL of the command line
// or the environment).
func completeSessionIDs(cf *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := cf.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
		defer cancel()
		items, err := sessionListing(c, "", "", 200, false, io.Discard, true).fetch(ctx)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, s := range items {
			out = append(out, cobra.CompletionWithDesc(s.ID, string(s.Kind)+" "+string(s.Status.Phase)))
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func writeSession(w io.Writer, s api.SessionView) {
	t := newTable(w)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(t, "%s:\t%s\n", k, v)
		}
	}
	row("ID", s.ID)
	row("Owner", s.Owner)
	row("Team", s.Team)
	row("Kind", string(s.Kind))
	row("Name", s.Name)
	row("Image", s.Image)
	if len(s.Command) > 0 {
		row("Command", strings.Join(s.Command, " "))
	}
	row("GPUs", gpuText(s.Resources))
	row("CPU", fmt.Sprintf("%g cores, %d MiB", float64(s.Resources.CPUMilli)/1000, s.Resources.MemoryMiB))
	if s.Gang() {
		onFailure := state.PartFailureContinue
		if s.StopsAll() {
			onFailure = state.PartFailureStopAll
		}
		machines := fmt.Sprintf("%d machines", s.Nodes)
		if el := s.Elastic; el != nil && el.ByNodes() {
			machines = el.Range(0) + " (elastic)"
			if st := s.Status.Elastic; st != nil && st.Nodes > 0 && !s.Status.Phase.Terminal() {
				machines = st.Range(st.Nodes) + " (elastic)"
			}
		}
		row("Parts", fmt.Sprintf("%s, each with the above; on part failure: %s", machines, onFailure))
	}
	if s.ShmMiB > 0 {
		row("Shared memory", fmt.Sprintf("%d MiB", s.ShmMiB))
	}
	if u := s.Ulimits; u != nil {
		memlock := "unlimited"
		if u.MemlockKiB != state.UlimitUnlimited {
			memlock = fmt.Sprintf("%d KiB", u.MemlockKiB)
		}
		row("Ulimits", fmt.Sprintf("nofile %d, memlock %s", u.Nofile, memlock))
	}
	for _, v := range s.Volumes {
		mode := "read-write"
		if v.ReadOnly {
			mode = "read-only"
		}
		row("Volume "+v.Name, fmt.Sprintf("%s (%s)", v.MountPath, mode))
	}
	row("Desired", string(s.Desired))
	row("Phase", string(s.Status.Phase))
	row("Reason", s.Status.Reason)
	row("Message", s.Status.Message)
	if s.Status.QueuePosition > 0 {
		row("Queue", fmt.Sprintf("position %d", s.Status.QueuePosition))
	}
	row("Nodes", strings.Join(s.Status.Nodes, ", ")) // a multi-node job's in rank order
	for _, k := range sortedMapKeys(s.Status.URLs) {
		row("URL "+k, s.Status.URLs[k])
	}
	if s.Status.ExitCode != nil {
		row("Exit code", itoa(*s.Status.ExitCode))
	}
	if w := s.Warning; w != nil {
		row("Warning", fmt.Sprintf("%s: will be stopped at %s (in %s)", w.Reason, w.StopAt.UTC().Format(timeLayout), until(w.StopAt)))
		row("Why", w.Message)
	}
	if s.Limits.MaxRuntime > 0 {
		row("Max runtime", s.Limits.MaxRuntime.Std().String())
	}
	if s.RunsUntil != nil {
		row("Runs until", fmt.Sprintf("%s (in %s)", s.RunsUntil.UTC().Format(timeLayout), until(*s.RunsUntil)))
	}
	if a := s.Status.Activity; a != nil {
		row("Last active", fmt.Sprintf("%s (%s ago)", a.LastActive.UTC().Format(timeLayout), age(a.LastActive)))
		if j := a.Jupyter; j != nil {
			row("Jupyter", fmt.Sprintf("%d kernel(s), %d busy, %d connection(s); last activity %s ago", j.Kernels, j.BusyKernels, j.Connections, age(j.LastActivity)))
		}
		for _, g := range a.GPUs {
			row("GPU "+g.UUID, gpuUse(g))
		}
	}
	row("Created", s.Created.Format(time.RFC3339))
	t.Flush()
}

// timeLayout is how the CLI writes a moment: UTC to the minute.
const timeLayout = "2006-01-02 15:04 UTC"

// gpuUse is one GPU's use in words: "93% busy, 1 process, 40960 MiB" or
// "unused since 09:20 UTC (2h)".
func gpuUse(g state.GPUActivity) string {
	use := fmt.Sprintf("%d%% busy, %d process(es), %d MiB", g.UtilizationPercent, g.Processes, g.MemoryUsedMiB)
	switch {
	case g.Unused && g.IdleSince != nil:
		use = fmt.Sprintf("UNUSED since %s (%s): no process, no utilisation", g.IdleSince.UTC().Format(timeLayout), age(*g.IdleSince))
	case g.Unused:
		use = "UNUSED: no process, no utilisation"
	case g.IdleSince != nil:
		use += fmt.Sprintf("; idle since %s", g.IdleSince.UTC().Format(timeLayout))
	}
	if g.Simulated {
		use += " (simulated)"
	}
	return use
}

// until is how long until t, rounded for reading ("1h5m0s", "overdue").
func until(t time.Time) string {
	d := time.Until(t)
	if d <= 0 {
		return "overdue"
	}
	if d > time.Minute {
		d = d.Round(time.Minute)
	} else {
		d = d.Round(time.Second)
	}
	return d.String()
}

func gpuText(r state.Resources) string {
	if r.GPUs == 0 {
		return "0"
	}
	s := itoa(r.GPUs)
	if r.GPUModel != "" {
		s += "×" + r.GPUModel
	}
	if r.MIGProfile != "" {
		s += " MIG " + r.MIGProfile
	}
	return s
}

func age(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// waitSession follows the event stream until the session reaches phase
// (or "end": any terminal phase).
func waitSession(ctx context.Context, c *client, id, phase string, timeout time.Duration, cf *clientFlags, stdout, stderr io.Writer) int {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var last api.Event
	reached := false
	lastID := ""
	for !reached && !last.Terminal {
		var err error
		lastID, err = c.follow(ctx, id, lastID, func(ev api.Event) bool {
			last = ev
			if !cf.structured() {
				fmt.Fprintln(stderr, ev.Message)
			}
			reached = strings.EqualFold(string(ev.Phase), phase) || (phase == "end" && ev.Terminal)
			return !reached && !ev.Terminal
		}, func(typ string, w api.WarningEvent) {
			if !cf.structured() {
				fmt.Fprintf(stderr, "%s: %s\n", strings.ToUpper(typ), w.Message)
			}
		})
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "voyager session wait: gave up: %v\n", context.Cause(ctx))
			return exitError
		}
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) {
				return cliFail(stderr, "session wait", err)
			}
			ctxwait.Sleep(ctx, time.Second) // a broken stream: resume after the last event
		}
	}
	if cf.structured() {
		_ = cf.show(stdout, last, nil)
	}
	if !reached {
		fmt.Fprintf(stderr, "voyager session wait: %s ended %s without reaching %s\n", id, last.Phase, phase)
		return exitError
	}
	return exitOK
}

func decodeJSON(r io.Reader, v any) error {
	return jsonDecode(r, v)
}
