package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

const nodeUsage = `<list|cordon|uncordon|drain> [flags] [NAME]`

const nodeDesc = `Shows and administers GPU nodes.

  list                               nodes with GPUs total, used, free and unused
                                     (allocated, but no process has run on them
                                     for VOYAGER_AGENT_GPU_UNUSED_AFTER; -o json
                                     names the sessions holding them)
  cordon [-reason R] NAME            no new sessions on NAME (admin)
  uncordon NAME                      undo cordon (admin)
  drain [-reason R] [-deadline D] NAME   cordon, and stop its notebooks after D (default: the
                                         cluster's drain deadline), each warned first (admin)`

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code := needSubcommand("node", nodeUsage, nodeDesc, args, stdout, stderr); code >= 0 {
		return code
	}
	sub, args := args[0], args[1:]
	name := "node " + sub
	fs := flag.NewFlagSet("voyager "+name, flag.ContinueOnError)
	var cf clientFlags
	var reason string
	deadline := time.Duration(-1) // unset: the cluster default
	wantArgs := 1
	switch sub {
	case "list":
		cf.register(fs, true)
		wantArgs = 0
	case "cordon":
		cf.register(fs, true)
		fs.StringVar(&reason, "reason", "", "why, for other admins")
	case "uncordon":
		cf.register(fs, true)
	case "drain":
		cf.register(fs, true)
		fs.StringVar(&reason, "reason", "", "why, for other admins")
		fs.DurationVar(&deadline, "deadline", -1, "let notebooks run this long (0: stop them now, after their warning; unset: the cluster's VOYAGER_DRAIN_DEADLINE)")
	default:
		fmt.Fprintf(stderr, "voyager node: unknown subcommand %q\n\nUsage: voyager node %s\n\n%s\n", sub, nodeUsage, nodeDesc)
		return exitUsage
	}
	if code := cliParse(fs, name, "[flags] NAME", nodeDesc, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() != wantArgs {
		fmt.Fprintf(stderr, "voyager %s: want %d argument(s), got %d\n", name, wantArgs, fs.NArg())
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		fmt.Fprintf(stderr, "voyager %s: %v\n", name, err)
		return exitUsage
	}
	if sub == "list" {
		var out struct {
			Items []api.NodeSummary `json:"items"`
		}
		if err := c.do(ctx, "GET", "/api/v1/nodes", nil, &out); err != nil {
			return cliFail(stderr, name, err)
		}
		if cf.output == "json" {
			return printOr(stdout, stderr, name, out.Items, nil)
		}
		t := newTable(stdout)
		fmt.Fprintln(t, "NAME\tGPUS FREE/TOTAL\tUNUSED\tMODELS\tCPU USED\tMEMORY USED\tSESSIONS\tSTATUS")
		for _, n := range out.Items {
			st := "ready"
			if n.Cordon != nil {
				st = "cordoned"
				if n.Cordon.Drain {
					st = "draining"
				}
			}
			if n.Simulated {
				st += " (simulated)"
			}
			fmt.Fprintf(t, "%s\t%d/%d\t%d\t%s\t%g/%g\t%d/%d MiB\t%d\t%s\n", n.Name, n.GPUs.Free, n.GPUs.Total, n.GPUs.Unused, models(n.Models),
				float64(n.CPUUsedMilli)/1000, float64(n.CPUMilli)/1000, n.MemoryUsedMiB, n.MemoryMiB, n.Sessions, st)
		}
		t.Flush()
		return exitOK
	}
	node := fs.Arg(0)
	var body any
	if sub != "uncordon" {
		req := api.CordonRequest{Reason: reason}
		if deadline >= 0 {
			d := state.Duration(deadline)
			req.Deadline = &d
		}
		body = req
	}
	var out json.RawMessage
	if err := c.do(ctx, "POST", "/api/v1/nodes/"+url.PathEscape(node)+"/"+sub, body, &out); err != nil {
		return cliFail(stderr, name, err)
	}
	if cf.output == "json" {
		_, _ = stdout.Write(append(out, '\n'))
		return exitOK
	}
	fmt.Fprintf(stdout, "node %s: %sed\n", node, strings.TrimSuffix(sub, "e"))
	return exitOK
}

func models(m map[string]int) string {
	var parts []string
	for _, k := range sortedMapKeys(m) {
		parts = append(parts, fmt.Sprintf("%d×%s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

func sortedMapKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func jsonDecode(r io.Reader, v any) error {
	if err := json.NewDecoder(r).Decode(v); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}
