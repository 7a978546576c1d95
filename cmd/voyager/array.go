package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/state"
)

// arrayFlags are voyager run's job-array flags.
type arrayFlags struct {
	indices, paramsFile string
	maxRunning          int
}

func (f *arrayFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.indices, "array", "", "run a job array, one element per index: 0-99, 0-99:10, 1,5,7-9 ({index} in the command)")
	fs.StringVar(&f.paramsFile, "params", "", "run a job array, one element per line of this file ({param} in the command)")
	fs.IntVar(&f.maxRunning, "max-running", 0, "with -array or -params: at most this many elements unfinished at once (0: no cap)")
}

func (f *arrayFlags) set() bool { return f.indices != "" || f.paramsFile != "" }

// request builds the array request around a session request.
func (f *arrayFlags) request(r api.SessionRequest) (api.ArrayRequest, error) {
	ar := api.ArrayRequest{SessionRequest: r, Indices: f.indices, MaxRunning: f.maxRunning}
	if f.paramsFile == "" {
		return ar, nil
	}
	if f.indices != "" {
		return ar, errors.New("give -array or -params, not both")
	}
	file, err := os.Open(f.paramsFile)
	if err != nil {
		return ar, fmt.Errorf("read -params: %w", err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	ar.Params = []string{}
	for sc.Scan() {
		if line := strings.TrimRight(sc.Text(), "\r"); strings.TrimSpace(line) != "" {
			ar.Params = append(ar.Params, line)
		}
	}
	if err := sc.Err(); err != nil {
		return ar, fmt.Errorf("read -params %s: %w", f.paramsFile, err)
	}
	if len(ar.Params) == 0 {
		return ar, fmt.Errorf("read -params %s: no lines; want one parameter per line", f.paramsFile)
	}
	return ar, nil
}

// runArray submits a job array, waits for it to end and returns voyager
// run's exit code: 0 when every element succeeded.
func runArray(ctx context.Context, c *client, spec *specFlags, af *arrayFlags, command []string, quiet, asJSON bool, stdout, stderr io.Writer) int {
	sr, err := spec.request(command)
	if err != nil {
		fmt.Fprintf(stderr, "voyager run: %v\n", err)
		return exitUsage
	}
	req, err := af.request(sr)
	if err != nil {
		fmt.Fprintf(stderr, "voyager run: %v\n", err)
		return exitUsage
	}
	progress := func(format string, a ...any) {
		if !quiet {
			fmt.Fprintf(stderr, "voyager run: "+format+"\n", a...)
		}
	}
	var v api.ArrayView
	if err := postIdempotent(ctx, c, "/api/v1/arrays", req, spec.idempotencyKey, &v); err != nil {
		return cliFail(stderr, "run", err)
	}
	progress("array %s submitted: %d elements, at most %d at once", v.ID, v.Summary.Size, v.MaxRunning)
	return followArray(ctx, c, v.ID, asJSON, stdout, stderr, progress)
}

// arrayPoll is how often a waiting CLI reads an array's summary.
const arrayPoll = time.Second

// followArray waits for array id to end, printing each change of its
// summary, then the summary; Ctrl-C stops the array. It returns 0 when
// every element succeeded, exitError otherwise, exitRunInterrupted when
// interrupted.
func followArray(ctx context.Context, c *client, id string, asJSON bool, stdout, stderr io.Writer, progress func(string, ...any)) int {
	var v api.ArrayView
	last := ""
	for {
		err := c.do(ctx, "GET", "/api/v1/arrays/"+url.PathEscape(id), nil, &v)
		if ctx.Err() != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			var sr api.ArrayStopResult
			if err := c.do(sctx, "POST", "/api/v1/arrays/"+url.PathEscape(id)+"/stop", nil, &sr); err != nil {
				fmt.Fprintf(stderr, "voyager run: interrupted; stopping array %s failed: %v\n", id, err)
			} else {
				fmt.Fprintf(stderr, "voyager run: interrupted; array %s stopped (%d elements stopping)\n", id, sr.Stopping)
			}
			return exitRunInterrupted
		}
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) && ae.status != http.StatusServiceUnavailable && ae.status != http.StatusTooManyRequests {
				return cliFail(stderr, "run", err)
			}
			progress("%v; retrying", err)
		} else {
			if line := arrayLine(v); line != last {
				progress("%s", line)
				last = line
			}
			if v.Summary.Done {
				break
			}
		}
		if !ctxwait.Sleep(ctx, arrayPoll) {
			continue // the next round sees ctx done and stops the array
		}
	}
	if asJSON {
		_ = writeJSON(stdout, v)
	} else {
		for _, e := range v.Elements {
			if e.Phase != state.PhaseSucceeded {
				progress("  element %d (%s): %s%s", e.Index, e.Session, e.Phase, exitText(e.ExitCode))
			}
		}
	}
	s := v.Summary
	if s.Succeeded == s.Size {
		return exitOK
	}
	return exitError
}

func exitText(code *int) string {
	if code == nil {
		return ""
	}
	return fmt.Sprintf(", exit %d", *code)
}

// arrayLine is an array's summary in one line.
func arrayLine(v api.ArrayView) string {
	s := v.Summary
	ended := s.Succeeded + s.Failed + s.Stopped
	line := fmt.Sprintf("array %s: %d/%d ended (%d succeeded, %d failed, %d stopped), %d running, %d pending, %d waiting",
		v.ID, ended, s.Size, s.Succeeded, s.Failed, s.Stopped, s.Running, s.Pending, s.Waiting)
	if s.Skipped > 0 {
		line += fmt.Sprintf(", %d skipped", s.Skipped)
	}
	if s.Done {
		line += "; done"
	}
	return line
}

const arrayLong = `Lists, reads, waits for and stops job arrays (sweeps), which voyager run
-array or -params submits: one session per element, at most -max-running
of them unfinished at once.`

func newArrayCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "array",
		Aliases: []string{"arrays"},
		Short:   "List, get, wait for and stop job arrays (sweeps)",
		Long:    arrayLong,
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(newArrayListCmd(), newArrayGetCmd(), newArrayWaitCmd(), newArrayStopCmd())
	return cmd
}

func newArrayListCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List job arrays with their summaries",
		Args:  cobra.NoArgs,
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, _ []string) error {
			return callShow(cmd, c, &cf, "GET", "/api/v1/arrays", func(l api.ArrayList) any { return l.Items }, func(w io.Writer, l api.ArrayList) {
				tw := newTable(w)
				fmt.Fprintln(tw, "ID\tOWNER\tSIZE\tMAX\tSUCCEEDED\tFAILED\tSTOPPED\tRUNNING\tPENDING\tWAITING\tDONE")
				for _, v := range l.Items {
					s := v.Summary
					fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%v\n", v.ID, v.Owner, s.Size, v.MaxRunning,
						s.Succeeded, s.Failed, s.Stopped, s.Running, s.Pending, s.Waiting, s.Done)
				}
				_ = tw.Flush()
			})
		}),
	}
	cf.register(cmd, true)
	return cmd
}

func newArrayGetCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Print a job array's summary and every element's phase and exit code",
		Args:  exactArgs(1),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			return callShow(cmd, c, &cf, "GET", "/api/v1/arrays/"+url.PathEscape(args[0]), nil, writeArray)
		}),
	}
	cf.register(cmd, true)
	return cmd
}

// writeArray prints an array's summary, then one line per element.
func writeArray(w io.Writer, v api.ArrayView) {
	fmt.Fprintln(w, arrayLine(v))
	fmt.Fprintf(w, "command: %s\n", strings.Join(v.Template.Command, " "))
	phases := make([]string, 0, len(v.Summary.Phases))
	for p, n := range v.Summary.Phases {
		phases = append(phases, fmt.Sprintf("%s=%d", p, n))
	}
	sort.Strings(phases)
	fmt.Fprintf(w, "phases: %s\n", dash(strings.Join(phases, " ")))
	tw := newTable(w)
	fmt.Fprintln(tw, "INDEX\tSESSION\tPHASE\tEXIT\tNODES")
	for _, e := range v.Elements {
		exit := "-"
		if e.ExitCode != nil {
			exit = itoa(*e.ExitCode)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", e.Index, e.Session, e.Phase, exit, dash(strings.Join(e.Nodes, ",")))
	}
	_ = tw.Flush()
}

func newArrayWaitCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Wait until every element of a job array ended; exit 1 if any did not succeed",
		Long: `Waits until every element of a job array ended, printing each change of its
summary on stderr, then the elements that did not succeed (-o json: the
array on stdout). Exits 0 when every element succeeded, 1 otherwise.
Interrupting it (Ctrl-C) stops the array.`,
		Args: exactArgs(1),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			progress := func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), "voyager array: "+format+"\n", a...) }
			return withCode(followArray(cmd.Context(), c, args[0], cf.output == "json", cmd.OutOrStdout(), cmd.ErrOrStderr(), progress))
		}),
	}
	cf.register(cmd, true)
	return cmd
}

func newArrayStopCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "stop ID",
		Short: "Stop a job array: no more elements, every unfinished one stopped",
		Args:  exactArgs(1),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			return callShow(cmd, c, &cf, "POST", "/api/v1/arrays/"+url.PathEscape(args[0])+"/stop", nil, func(w io.Writer, r api.ArrayStopResult) {
				fmt.Fprintf(w, "%s: stopped; %d elements stopping\n%s\n", args[0], r.Stopping, arrayLine(r.Array))
			})
		}),
	}
	cf.register(cmd, true)
	return cmd
}

// callShow calls the API without a body and shows the answer as -o asks:
// structured (what pick makes of it, when not nil), or by table.
func callShow[T any](cmd *cobra.Command, c *client, cf *clientFlags, method, path string, pick func(T) any, table func(io.Writer, T)) error {
	var v T
	if err := c.do(cmd.Context(), method, path, nil, &v); err != nil {
		return cliError(cmd, err)
	}
	var shown any = v
	if pick != nil {
		shown = pick(v)
	}
	return cf.show(cmd.OutOrStdout(), shown, func(w io.Writer, _ bool) { table(w, v) })
}
