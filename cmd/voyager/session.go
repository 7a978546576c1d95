package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/state"
)

// specFlags are the flags that describe a session, shared by
// `voyager session create` and `voyager run`.
type specFlags struct {
	kind, name, profile, image string
	gpus                       int
	gpuModel, mig              string
	gpuMemory, memory          int64
	cpu                        float64
	env                        multiFlag
	rayWorkers                 int
	maxRuntime, idleTimeout    time.Duration
	priority                   int
	preemptible                bool
	restart                    string
	maxRestarts                int
	idempotencyKey             string
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func (s *specFlags) register(fs *flag.FlagSet, withKind bool) {
	if withKind {
		fs.StringVar(&s.kind, "kind", "notebook", "notebook or batch")
	}
	fs.StringVar(&s.name, "name", "", "a label for the session")
	fs.StringVar(&s.profile, "profile", "", "an admin-defined profile (GET /api/v1/profiles)")
	fs.StringVar(&s.image, "image", "", "container image (unless the profile sets one)")
	fs.IntVar(&s.gpus, "gpus", 0, "whole GPUs (or MIG devices with -mig)")
	fs.StringVar(&s.gpuModel, "gpu-model", "", `GPU model pattern, e.g. "*A100*"`)
	fs.Int64Var(&s.gpuMemory, "gpu-memory", 0, "least memory per GPU, MiB")
	fs.StringVar(&s.mig, "mig", "", "MIG profile, e.g. 1g.10gb")
	fs.Float64Var(&s.cpu, "cpu", 0, "CPU cores (default 1)")
	fs.Int64Var(&s.memory, "memory", 0, "memory in MiB (default 4096)")
	fs.Var(&s.env, "env", "KEY=VALUE for the container's environment (repeatable)")
	fs.IntVar(&s.rayWorkers, "ray-workers", 0, "Ray workers on more nodes")
	fs.DurationVar(&s.maxRuntime, "max-runtime", 0, "stop after this long running (0: no limit)")
	fs.DurationVar(&s.idleTimeout, "idle-timeout", 0, "stop a notebook idle this long (0: cluster default)")
	fs.IntVar(&s.priority, "priority", 0, "queue priority, -100 to 100")
	fs.BoolVar(&s.preemptible, "preemptible", false, "may be stopped for higher-priority sessions")
	fs.StringVar(&s.restart, "restart", "", "restart policy of batch sessions: Never or OnFailure")
	fs.IntVar(&s.maxRestarts, "max-restarts", 0, "restarts allowed with -restart OnFailure")
	fs.StringVar(&s.idempotencyKey, "idempotency-key", "", "makes a retried create return the first session (default: a random key)")
}

// request builds the create request; command may be empty.
func (s *specFlags) request(command []string) (api.SessionRequest, error) {
	r := api.SessionRequest{
		Kind: state.SessionKind(s.kind), Name: s.name, Profile: s.profile, Image: s.image,
		Command: command, Priority: s.priority, Preemptible: s.preemptible,
	}
	if s.gpus != 0 || s.gpuModel != "" || s.gpuMemory != 0 || s.mig != "" || s.cpu != 0 || s.memory != 0 || s.profile == "" {
		r.Resources = &state.Resources{GPUs: s.gpus, GPUModel: s.gpuModel, GPUMemoryMiB: s.gpuMemory, MIGProfile: s.mig,
			CPUMilli: int64(s.cpu * 1000), MemoryMiB: s.memory}
	}
	for _, kv := range s.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return r, fmt.Errorf("invalid -env %q: want KEY=VALUE", kv)
		}
		if r.Env == nil {
			r.Env = map[string]string{}
		}
		r.Env[k] = v
	}
	if s.rayWorkers > 0 {
		r.Ray = &state.Ray{Workers: s.rayWorkers}
	}
	if s.maxRuntime != 0 || s.idleTimeout != 0 {
		r.Limits = &state.Limits{MaxRuntime: state.Duration(s.maxRuntime), IdleTimeout: state.Duration(s.idleTimeout)}
	}
	if s.restart != "" || s.maxRestarts != 0 {
		r.Restart = &state.RestartPolicy{Policy: s.restart, MaxRestarts: s.maxRestarts}
	}
	return r, nil
}

// create submits r with an idempotency key, so a retry after a lost
// answer never makes a second session.
func create(ctx context.Context, c *client, r api.SessionRequest, key string) (api.SessionView, error) {
	if key == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		key = hex.EncodeToString(b)
	}
	var v api.SessionView
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var resp io.ReadCloser
		hr, rerr := c.request(ctx, "POST", "/api/v1/sessions", r, map[string]string{api.IdempotencyKeyHeader: key})
		if rerr == nil {
			resp = hr.Body
			err = decodeJSON(resp, &v)
			resp.Close()
			return v, err
		}
		err = rerr
		var ae *apiError
		// The API answered: retrying gives the same answer, except a 503
		// (etcd did not answer, e.g. while it elects a leader).
		if (errors.As(rerr, &ae) && ae.status != http.StatusServiceUnavailable) || ctx.Err() != nil {
			return v, err
		}
		select { // the same key makes the retry safe
		case <-ctx.Done():
			return v, err
		case <-time.After(time.Duration(attempt+1) * 500 * time.Millisecond):
		}
	}
	return v, err
}

const sessionUsage = `<create|list|get|stop|extend|logs|wait> [flags] [args]`

const sessionDesc = `Manages your sessions over the HTTP API.

  create [flags] [-- COMMAND…]   submit a session (notebook by default)
  list [-phase P] [-owner U]     your sessions (admins: anyone's with -owner)
  get ID                         a session's spec and status, with any warning
                                 that the system will stop it, its last
                                 activity and its GPUs' use
  stop ID                        stop it (a pending one is cancelled)
  extend ID DURATION             let it run DURATION longer than its max
                                 runtime (up to the cluster's cap)
  logs [-f] [-tail N] ID         its container output
  wait [-for PHASE] ID           wait until it is Running (or any PHASE, or "end"),
                                 printing each change and warning`

func runSession(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code := needSubcommand("session", sessionUsage, sessionDesc, args, stdout, stderr); code >= 0 {
		return code
	}
	sub, args := args[0], args[1:]
	name := "session " + sub
	fs := flag.NewFlagSet("voyager "+name, flag.ContinueOnError)
	var cf clientFlags
	var (
		spec         specFlags
		phase, owner string
		limit        int
		all, follow  bool
		tail         int
		waitFor      string
		timeout      time.Duration
		usage, desc  string
		wantArgs     = 1
	)
	switch sub {
	case "create":
		cf.register(fs, true)
		spec.register(fs, true)
		usage, desc, wantArgs = "[flags] [-- COMMAND ARGS…]", "Submits a session and prints it.", -1
	case "list":
		cf.register(fs, true)
		fs.StringVar(&phase, "phase", "", "only sessions in this phase")
		fs.StringVar(&owner, "owner", "", "only this owner's (admins)")
		fs.IntVar(&limit, "limit", 50, "sessions per page")
		fs.BoolVar(&all, "all", false, "fetch every page")
		usage, desc, wantArgs = "[flags]", "Lists sessions, oldest first.", 0
	case "get":
		cf.register(fs, true)
		usage, desc = "[flags] ID", "Prints a session's spec and status."
	case "stop":
		cf.register(fs, true)
		usage, desc = "[flags] ID", "Stops a session: a pending one is cancelled at once, a running one is stopped by its node agent."
	case "extend":
		cf.register(fs, true)
		usage, desc, wantArgs = "[flags] ID DURATION", `Extends a session's max runtime by DURATION (a Go duration such as 2h or
90m): its limit becomes the one that applies now (its own, else the
cluster's VOYAGER_MAX_RUNTIME) plus DURATION, up to the cluster's cap
(VOYAGER_MAX_RUNTIME_CAP). A max runtime warning is withdrawn once the new
limit moves the stop beyond the warning window.`, 2
	case "logs":
		cf.register(fs, false)
		fs.BoolVar(&follow, "f", false, "follow: keep streaming until the container exits")
		fs.IntVar(&tail, "tail", 0, "only the last N lines (0: all)")
		usage, desc = "[flags] ID", "Prints a session's container output."
	case "wait":
		cf.register(fs, true)
		fs.StringVar(&waitFor, "for", "Running", `phase to wait for, or "end" for any terminal phase`)
		fs.DurationVar(&timeout, "timeout", 0, "give up after this long (0: never)")
		usage, desc = "[flags] ID", "Waits until a session reaches a phase, printing each change. Exits 1 if it ends without reaching it."
	default:
		fmt.Fprintf(stderr, "voyager session: unknown subcommand %q\n\nUsage: voyager session %s\n\n%s\n", sub, sessionUsage, sessionDesc)
		return exitUsage
	}
	if code := cliParse(fs, name, usage, desc, args, stdout, stderr); code >= 0 {
		return code
	}
	if wantArgs >= 0 && fs.NArg() != wantArgs {
		fmt.Fprintf(stderr, "voyager %s: want %d argument(s), got %d\n", name, wantArgs, fs.NArg())
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		fmt.Fprintf(stderr, "voyager %s: %v\n", name, err)
		return exitUsage
	}
	id := fs.Arg(0)
	var out any
	switch sub {
	case "create":
		r, err := spec.request(fs.Args())
		if err != nil {
			fmt.Fprintf(stderr, "voyager %s: %v\n", name, err)
			return exitUsage
		}
		v, err := create(ctx, c, r, spec.idempotencyKey)
		if err != nil {
			return cliFail(stderr, name, err)
		}
		out = v
	case "list":
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
				return cliFail(stderr, name, err)
			}
			items = append(items, page.Items...)
			if page.Continue == "" || !all {
				if page.Continue != "" && cf.output == "table" {
					defer fmt.Fprintln(stderr, "(more: use -all)")
				}
				break
			}
			q.Set("continue", page.Continue)
		}
		if items == nil {
			items = []api.SessionView{}
		}
		out = items
	case "get":
		var v api.SessionView
		if err := c.do(ctx, "GET", "/api/v1/sessions/"+url.PathEscape(id), nil, &v); err != nil {
			return cliFail(stderr, name, err)
		}
		out = v
	case "stop":
		var r api.StopResult
		if err := c.do(ctx, "POST", "/api/v1/sessions/"+url.PathEscape(id)+"/stop", nil, &r); err != nil {
			return cliFail(stderr, name, err)
		}
		if cf.output == "json" {
			return printOr(stdout, stderr, name, r, nil)
		}
		fmt.Fprintf(stdout, "%s: %s (phase %s)\n", id, r.Outcome, r.Session.Status.Phase)
		return exitOK
	case "extend":
		by, err := time.ParseDuration(fs.Arg(1))
		if err != nil || by <= 0 {
			fmt.Fprintf(stderr, "voyager %s: invalid duration %q: want a positive Go duration such as 2h or 90m\n", name, fs.Arg(1))
			return exitUsage
		}
		var v api.SessionView
		if err := c.do(ctx, "POST", "/api/v1/sessions/"+url.PathEscape(id)+"/extend", api.ExtendRequest{By: state.Duration(by)}, &v); err != nil {
			return cliFail(stderr, name, err)
		}
		if cf.output == "json" {
			return printOr(stdout, stderr, name, v, nil)
		}
		msg := fmt.Sprintf("%s: max runtime now %s", id, v.Limits.MaxRuntime.Std())
		if v.RunsUntil != nil {
			msg += ", runs until " + v.RunsUntil.UTC().Format(timeLayout)
		}
		fmt.Fprintln(stdout, msg)
		return exitOK
	case "logs":
		if err := c.logs(ctx, id, tail, follow, stdout); err != nil {
			return cliFail(stderr, name, err)
		}
		return exitOK
	case "wait":
		return waitSession(ctx, c, id, waitFor, timeout, cf.output, stdout, stderr)
	}
	if cf.output == "json" {
		return printOr(stdout, stderr, name, out, nil)
	}
	return printOr(stdout, stderr, name, out, func(w io.Writer) { writeSessions(w, out) })
}

// printOr prints v as JSON for -o json, else with table (when not nil).
func printOr(stdout, stderr io.Writer, name string, v any, table func(io.Writer)) int {
	if table == nil {
		if err := writeJSON(stdout, v); err != nil {
			return cliFail(stderr, name, err)
		}
		return exitOK
	}
	table(stdout)
	return exitOK
}

func writeSessions(w io.Writer, v any) {
	var list []api.SessionView
	switch x := v.(type) {
	case api.SessionView:
		writeSession(w, x)
		return
	case []api.SessionView:
		list = x
	}
	t := newTable(w)
	fmt.Fprintln(t, "ID\tOWNER\tKIND\tGPUS\tPHASE\tREASON\tAGE")
	for _, s := range list {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Owner, s.Kind, gpuText(s.Resources), s.Status.Phase, s.Status.Reason, age(s.Created))
	}
	t.Flush()
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
	row("Kind", string(s.Kind))
	row("Name", s.Name)
	row("Image", s.Image)
	if len(s.Command) > 0 {
		row("Command", strings.Join(s.Command, " "))
	}
	row("GPUs", gpuText(s.Resources))
	row("CPU", fmt.Sprintf("%g cores, %d MiB", float64(s.Resources.CPUMilli)/1000, s.Resources.MemoryMiB))
	row("Desired", string(s.Desired))
	row("Phase", string(s.Status.Phase))
	row("Reason", s.Status.Reason)
	row("Message", s.Status.Message)
	if s.Status.QueuePosition > 0 {
		row("Queue", fmt.Sprintf("position %d", s.Status.QueuePosition))
	}
	row("Nodes", strings.Join(s.Status.Nodes, ", "))
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
func waitSession(ctx context.Context, c *client, id, phase string, timeout time.Duration, output string, stdout, stderr io.Writer) int {
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
			if output != "json" {
				fmt.Fprintln(stderr, ev.Message)
			}
			reached = strings.EqualFold(string(ev.Phase), phase) || (phase == "end" && ev.Terminal)
			return !reached && !ev.Terminal
		}, func(typ string, w api.WarningEvent) {
			if output != "json" {
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
	if output == "json" {
		_ = writeJSON(stdout, last)
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
