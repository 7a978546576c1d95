package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/state"
)

const runDesc = `Submits a batch session that runs COMMAND, shows its progress on stderr and
its output on stdout, and exits with the command's exit code. Interrupting
it (Ctrl-C) stops the session. At the end it prints one line on stderr:
node, GPUs, wall time, GPU-hours, exit code; with -o json the job's output
goes to stderr and stdout holds only that summary as one JSON object (for
an array: the array, with its summary and every element's exit code).

With -array (an index set: 0-99, 0-99:10, 1,5,7-9) or -params FILE (one
element per line) it submits a job array instead: one session per element,
{index} and {param} replaced in the command and --env values, at most
-max-running unfinished at once (the cluster enforces it). It waits for
the whole array, prints its summary, and exits 1 if any element did not
succeed; Ctrl-C stops every element. voyager array lists, reads, waits
for and stops arrays.

With --nodes N the job runs on N machines, one part each with the
resources asked for, started together or not at all; every part runs
COMMAND with MASTER_ADDR, MASTER_PORT, WORLD_SIZE (N), NODE_RANK and a
hostfile (VOYAGER_HOSTFILE) in its environment, so that torchrun, DeepSpeed
or mpirun find each other (docs/api.md). Its output is every part's, each
line prefixed "[rank R] "; its exit code rank 0's, or the first failed
part's (--on-part-failure StopAll, the default, also stops the others).
With --nodes MIN-MAX (e.g. 1-4) it is elastic: it starts on as many
machines as fair share and free machines allow, at least MIN, and is
restarted (SIGTERM, its grace to checkpoint) on more machines when they sit
idle, or on fewer, never below MIN, when waiting work is owed them; each
start sees its WORLD_SIZE, NNODES and NODE_RANK.`

// Exit codes of voyager run besides the job's own.
const (
	exitRunInterrupted = 130 // like a shell after SIGINT
)

func newRunCmd() *cobra.Command {
	var (
		cf    clientFlags
		spec  specFlags
		quiet bool
		arr   arrayFlags
	)
	cmd := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARGS…]",
		Short: "Run a batch command on GPUs and exit with its exit code",
		Long:  runDesc,
		Example: "  voyager run --gpus 1 -- python train.py\n  voyager run -- sh -c 'echo hi; exit 3'; echo $?   # hi, then 3\n" +
			"  voyager run -nodes 4 -gpus 8 -- torchrun train.py   # 4 machines; each line of output says its rank",
		GroupID: groupCLI,
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			if len(args) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "voyager run: want a command after --, e.g. voyager run -- sh -c 'echo hi'")
				return exitCode(exitUsage)
			}
			if cf.output != "" && cf.output != "json" {
				fmt.Fprintf(cmd.ErrOrStderr(), "voyager run: invalid -o %q: want json, or leave it out\n", cf.output)
				return exitCode(exitUsage)
			}
			spec.kind = string(state.KindBatch)
			if arr.set() {
				return withCode(runArray(cmd.Context(), c, &spec, &arr, args, quiet, cf.output == "json", cmd.OutOrStdout(), cmd.ErrOrStderr()))
			}
			return withCode(runBatch(cmd.Context(), c, &spec, args, quiet, cf.output == "json", cmd.OutOrStdout(), cmd.ErrOrStderr()))
		}),
	}
	cf.register(cmd, false)
	spec.register(cmd, false)
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress messages, only the command's output")
	cmd.Flags().StringVarP(&cf.output, "output", "o", "", "json: print the summary as one JSON object on stdout (the job's output goes to stderr)")
	arr.register(cmd)
	return cmd
}

// runBatch submits the batch session, follows it to its end and returns
// the exit code of voyager run.
func runBatch(ctx context.Context, c *client, spec *specFlags, command []string, quiet, asJSON bool, stdout, stderr io.Writer) int {
	req, err := spec.request(command)
	if err != nil {
		fmt.Fprintf(stderr, "voyager run: %v\n", err)
		return exitUsage
	}
	var mu sync.Mutex // the event loop and the log copy both report
	progress := func(format string, a ...any) {
		if !quiet {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(stderr, "voyager run: "+format+"\n", a...)
		}
	}
	v, err := create(ctx, c, req, spec.idempotencyKey)
	if err != nil {
		return cliFail(stderr, "run", err)
	}
	progress("session %s submitted", v.ID)
	out := stdout
	if asJSON { // stdout is the summary's alone
		out = stderr
	}
	r := &runner{c: c, id: v.ID, stdout: out, progress: progress}
	code := r.follow(ctx)
	if ctx.Err() != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var sr api.StopResult
		if err := c.do(sctx, "POST", "/api/v1/sessions/"+v.ID+"/stop", nil, &sr); err != nil {
			fmt.Fprintf(stderr, "voyager run: interrupted; stopping session %s failed: %v\n", v.ID, err)
		} else {
			fmt.Fprintf(stderr, "voyager run: interrupted; session %s %s\n", v.ID, sr.Outcome)
		}
		return exitRunInterrupted
	}
	if r.last.Terminal {
		summarize(v.Session, r.last.Status).report(asJSON, stdout, progress)
	}
	return code
}

// runner follows one batch session to its end.
type runner struct {
	c        *client
	id       string
	stdout   io.Writer
	progress func(string, ...any)

	last api.Event // the last status event seen

	logsOnce sync.Once
	logsDone chan struct{}
	changed  chan struct{} // a status event came: the log copy looks again
}

// logsWait bounds how long run waits for the rest of the output after the
// session ended.
const logsWait = 10 * time.Second

// follow relays events until a terminal phase and returns the exit code.
func (r *runner) follow(ctx context.Context) int {
	r.logsDone = make(chan struct{})
	r.changed = make(chan struct{}, 1)
	lctx, stopLogs := context.WithCancel(ctx)
	defer stopLogs()
	lastID := ""
	for !r.last.Terminal {
		var err error
		lastID, err = r.c.follow(ctx, r.id, lastID, func(ev api.Event) bool {
			r.last = ev
			if !ev.Terminal {
				r.progress("%s", ev.Message)
			}
			select {
			case r.changed <- struct{}{}:
			default: // one pending wake-up is enough
			}
			// An attempt ran: its output is there to copy. Events may
			// come coalesced (the stream sends the status as it is when
			// read), so an attempt that ran and failed may be seen only
			// as its back-off, never as Running: it is started then too,
			// or a restart that waits for its output to be read would
			// wait on us.
			if ev.Phase == state.PhaseRunning || ev.Status.Started != nil || ev.Status.Reason == state.ReasonBackOff {
				r.startLogs(lctx)
			}
			return !ev.Terminal
		}, func(typ string, w api.WarningEvent) {
			// Max runtime, preemption, a drain: the job's owner hears it
			// before it happens.
			if typ == api.EventWarningWithdrawn {
				r.progress("%s", w.Message)
				return
			}
			r.progress("warning: %s", w.Message)
		})
		if ctx.Err() != nil {
			return exitError
		}
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) && ae.status != http.StatusServiceUnavailable && ae.status != http.StatusTooManyRequests {
				r.progress("%v", err)
				return exitError
			}
			if !ctxwait.Sleep(ctx, time.Second) { // a broken stream: resume after the last event
				return exitError
			}
		}
	}
	// The job ended. If its output was never streamed (it finished before
	// we saw it running), the copy starts now and reads it whole; either
	// way, let it drain.
	r.startLogs(lctx)
	select {
	case <-r.logsDone:
	case <-time.After(logsWait):
		stopLogs()
		<-r.logsDone
	}
	// How it ended comes after all of its output, with the summary.
	r.progress("%s", r.last.Message)
	st := r.last.Status
	switch {
	case st.ExitCode != nil:
		return *st.ExitCode & 0xff
	case r.last.Phase == state.PhaseSucceeded:
		return exitOK
	}
	r.progress("session %s ended %s without an exit code", r.id, r.last.Phase)
	return exitError
}

// startLogs starts copying the session's output once: every attempt's,
// from the first on, each attempt of a restarting session announced on
// the progress stream, until the session has ended.
func (r *runner) startLogs(ctx context.Context) {
	r.logsOnce.Do(func() {
		go func() {
			defer close(r.logsDone)
			err := r.c.followLogs(ctx, r.id, 0, r.stdout, func(attempt int) {
				r.progress("output of attempt %d:", attempt+1)
			}, r.changed)
			if err != nil && ctx.Err() == nil {
				r.progress("no output: %v", err)
			}
		}()
	})
}
