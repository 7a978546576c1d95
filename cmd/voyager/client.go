package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// Environment of the CLI commands (not config settings: they belong to the
// person running the CLI, not to a Voyager process).
const (
	envURL   = "VOYAGER_URL"
	envToken = "VOYAGER_TOKEN"
)

const defaultURL = "http://127.0.0.1:7070"

// cliEnvHelp documents the CLI's environment in --help.
const cliEnvHelp = `  VOYAGER_URL    the API's base URL (default http://127.0.0.1:7070)
  VOYAGER_TOKEN  a JWT for the API (voyager token mints one for voyager dev)
`

// Output formats of -o.
var outputFormats = []string{"table", "wide", "json", "yaml", "name"}

// clientFlags are the flags every CLI command shares.
type clientFlags struct {
	url, token, output string
}

// register adds --url and --token to cmd, and -o when the command reads
// (prints what the API answered), and documents the CLI's environment.
func (f *clientFlags) register(cmd *cobra.Command, reads bool) {
	fs := cmd.Flags()
	fs.StringVar(&f.url, "url", "", "API base URL (overrides "+envURL+")")
	fs.StringVar(&f.token, "token", "", "API token (overrides "+envToken+")")
	if reads {
		fs.StringVarP(&f.output, "output", "o", "table", "output: "+strings.Join(outputFormats, ", ")+" (wide: a table with more columns; name: only the IDs, for scripts)")
		_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
	}
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[envAnnotation] = cliEnvHelp
}

// structured reports whether -o asks for JSON, YAML or names rather than
// a table (and so for nothing else on stdout).
func (f *clientFlags) structured() bool {
	return f.output == "json" || f.output == "yaml" || f.output == "name"
}

// show writes v as JSON or YAML for -o json|yaml, else as table writes
// it (wide for -o wide).
func (f *clientFlags) show(w io.Writer, v any, table func(w io.Writer, wide bool)) error {
	switch f.output {
	case "json":
		return writeJSON(w, v)
	case "yaml":
		return writeYAML(w, v)
	case "name":
		names, ok := namesOf(v)
		if !ok {
			return fmt.Errorf("-o name: this command prints no names; use json or yaml")
		}
		for _, n := range names {
			fmt.Fprintln(w, n)
		}
		return nil
	}
	table(w, f.output == "wide")
	return nil
}

// namesOf is what -o name prints of v: session IDs, node names.
func namesOf(v any) ([]string, bool) {
	switch x := v.(type) {
	case api.SessionView:
		return []string{x.ID}, true
	case api.StopResult:
		return []string{x.Session.ID}, true
	case []api.StopResult:
		return mapNames(x)
	case api.NodeSummary:
		return []string{x.Name}, true
	case api.QueueEntry:
		return []string{dash(x.Session)}, true
	case []api.SessionView:
		return mapNames(x)
	case []api.NodeSummary:
		return mapNames(x)
	case []api.QueueEntry:
		return mapNames(x)
	case state.Volume:
		return []string{x.Name}, true
	case state.Team:
		return []string{x.Name}, true
	case []state.Team:
		return mapNames(x)
	case []state.Volume:
		return mapNames(x)
	case api.ArrayView:
		return []string{x.ID}, true
	case []api.ArrayView:
		return mapNames(x)
	}
	return nil, false
}

func mapNames[T any](items []T) ([]string, bool) {
	out := make([]string, 0, len(items))
	for _, it := range items {
		n, ok := namesOf(it)
		if !ok {
			return nil, false
		}
		out = append(out, n...)
	}
	return out, true
}

func (f *clientFlags) client() (*client, error) {
	base := f.url
	if base == "" {
		base = os.Getenv(envURL)
	}
	if base == "" {
		base = defaultURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("parse API URL %q (%s): want http://host:port", base, envURL)
	}
	tok := f.token
	if tok == "" {
		tok = os.Getenv(envToken)
	}
	if tok == "" {
		return nil, fmt.Errorf("no API token: set %s (for voyager dev: export %s=$(voyager token))", envToken, envToken)
	}
	if f.output != "" && !slices.Contains(outputFormats, f.output) {
		return nil, fmt.Errorf("invalid -o %q: want one of %s", f.output, strings.Join(outputFormats, ", "))
	}
	return &client{base: strings.TrimRight(base, "/"), token: tok, hc: &http.Client{}}, nil
}

// groupRunE answers a command group (session, node) called without a
// subcommand: its help, on stderr, as a usage error.
func groupRunE(cmd *cobra.Command, _ []string) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: want a subcommand\n\n", cmd.CommandPath())
	cmd.SetOut(cmd.ErrOrStderr())
	_ = cmd.Usage()
	return exitCode(exitUsage)
}

// cliRunE adapts a CLI command's body: it builds the client from cf (a bad
// URL, token or -o is a usage error) and runs fn with it.
func cliRunE(cf *clientFlags, fn func(cmd *cobra.Command, c *client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", cmd.CommandPath(), err)
			return exitCode(exitUsage)
		}
		c.warn = cmd.ErrOrStderr()
		return fn(cmd, c, args)
	}
}

// cliError reports err of the command cmd and returns exitError.
func cliError(cmd *cobra.Command, err error) error {
	return exitCode(cliFail(cmd.ErrOrStderr(), strings.TrimPrefix(cmd.CommandPath(), "voyager "), err))
}

// client calls the HTTP API.
type client struct {
	base, token string
	hc          *http.Client
	// warn, when set, receives the API's Warning headers (a budget
	// nearly spent), one line each.
	warn io.Writer
}

// apiError is a problem document answered by the API.
type apiError struct {
	status int
	p      api.Problem
}

func (e *apiError) Error() string {
	if e.p.Detail != "" {
		return e.p.Detail
	}
	return fmt.Sprintf("%d %s", e.status, http.StatusText(e.status))
}

// answerError reads an error answer of the API (an HTTP request's or a
// refused WebSocket upgrade's) into an apiError: its problem's detail, else
// the status and the body as they came.
func answerError(resp *http.Response) *apiError {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &apiError{status: resp.StatusCode}
	if json.Unmarshal(b, &e.p) != nil || e.p.Detail == "" {
		e.p.Detail = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return e
}

func (c *client) request(ctx context.Context, method, path string, body any, headers map[string]string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("call %s (%s): %w", c.base, envURL, err)
	}
	printWarnings(c.warn, resp.Header)
	if resp.StatusCode >= 300 {
		return nil, answerError(resp)
	}
	return resp, nil
}

// do calls the API and decodes a JSON answer into out (when not nil).
func (c *client) do(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.request(ctx, method, path, body, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer of %s %s: %w", method, path, err)
	}
	return nil
}

// follow reads a session's event stream until it ends, calling fn for
// each status event and warn (when not nil) for each warning and
// withdrawal; events of types it does not know are skipped. It returns
// the id of the last event seen.
func (c *client) follow(ctx context.Context, id, lastID string, fn func(api.Event) bool, warn func(typ string, w api.WarningEvent)) (string, error) {
	h := map[string]string{"Accept": "text/event-stream"}
	if lastID != "" {
		h["Last-Event-ID"] = lastID
	}
	resp, err := c.request(ctx, "GET", "/api/v1/sessions/"+url.PathEscape(id)+"/events", nil, h)
	if err != nil {
		return lastID, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var evID string
	evType := api.EventStatus
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			evType = api.EventStatus // the SSE default, for the next event
		case strings.HasPrefix(line, "id: "):
			evID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			evType = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data := []byte(strings.TrimPrefix(line, "data: "))
			switch evType {
			case api.EventStatus:
				var ev api.Event
				if err := json.Unmarshal(data, &ev); err != nil {
					continue
				}
				lastID = evID
				if !fn(ev) {
					return lastID, nil
				}
			case api.EventWarning, api.EventWarningWithdrawn:
				var w api.WarningEvent
				if err := json.Unmarshal(data, &w); err != nil {
					continue
				}
				lastID = evID
				if warn != nil {
					warn(evType, w)
				}
			}
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return lastID, fmt.Errorf("read events: %w", err)
	}
	return lastID, nil
}

// logs copies a session's logs to w.
func (c *client) logs(ctx context.Context, id string, tail int, follow bool, w io.Writer) error {
	resp, err := c.request(ctx, "GET", fmt.Sprintf("/api/v1/sessions/%s/logs?tail=%d&follow=%t", url.PathEscape(id), tail, follow), nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil && ctx.Err() == nil {
		return fmt.Errorf("read logs: %w", err)
	}
	return nil
}

// followLogs copies the output of session id to w from its current
// attempt on: it streams each attempt until its container exits and, when
// the session is restarted (OnFailure), goes on with the next attempt,
// until the session has ended. Each attempt of a session that may restart
// is announced by mark (with the attempt, counted from 0) before its
// output. tail applies to the first attempt copied. Between looks at the
// session it waits a second, or less when changed (when not nil) says the
// session changed.
func (c *client) followLogs(ctx context.Context, id string, tail int, w io.Writer, mark func(attempt int), changed <-chan struct{}) error {
	copied, marked := -1, -1
	for {
		var v api.SessionView
		if err := c.do(ctx, "GET", "/api/v1/sessions/"+url.PathEscape(id), nil, &v); err != nil {
			return err
		}
		st := v.Status
		ended := st.Phase.Terminal()
		if st.Attempt != copied {
			if marked != st.Attempt && (v.Restart.Policy == state.RestartOnFailure || st.Attempt > 0) {
				mark(st.Attempt)
				marked = st.Attempt
			}
			// An ended session's container follows nothing more: read it whole.
			err := c.logs(ctx, id, tail, !ended, w)
			var ae *apiError
			switch {
			case err == nil:
				copied, tail = st.Attempt, 0
				continue // the container exited: see what the session does next
			case errors.As(err, &ae) && ae.status == http.StatusServiceUnavailable && !ended:
				// No container yet (pending, starting): ask again below.
			default:
				return err
			}
		} else if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-time.After(time.Second):
		}
	}
}

// writeJSON prints v indented, for -o json.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeYAML prints v as YAML with the field names of its JSON, for -o yaml.
func writeYAML(w io.Writer, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode yaml: %w", err)
	}
	_, err = w.Write(b)
	return err
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// cliFail reports err for command name and returns the exit code.
func cliFail(stderr io.Writer, name string, err error) int {
	fmt.Fprintf(stderr, "voyager %s: %v\n", name, err)
	var ae *apiError
	if errors.As(err, &ae) {
		for _, f := range ae.p.Errors {
			if !strings.Contains(ae.p.Detail, f.Field+": ") {
				fmt.Fprintf(stderr, "  %s: %s\n", f.Field, f.Message)
			}
		}
	}
	return exitError
}

func itoa(n int) string { return strconv.Itoa(n) }
