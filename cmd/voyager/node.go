package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "node",
		Aliases: []string{"nodes"},
		Short:   "List nodes; cordon, uncordon and drain them (admin)",
		Long:    "Shows and administers GPU nodes.",
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(newNodeListCmd(),
		newNodeActionCmd("cordon", "No new sessions on NAME (admin)", "Cordons NAME: no new session is placed on it; what runs there goes on."),
		newNodeActionCmd("uncordon", "Undo cordon (admin)", "Uncordons NAME: sessions may be placed on it again."),
		newNodeActionCmd("drain", "Cordon NAME and stop its notebooks after a deadline (admin)",
			`Drains NAME: cordons it, and stops its notebooks after --deadline (default:
the cluster's VOYAGER_DRAIN_DEADLINE), each warned first. Batch sessions run
to completion.`))
	return cmd
}

func newNodeListCmd() *cobra.Command {
	var (
		cf        clientFlags
		wf        watchFlags
		powerDown bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List nodes with their GPUs total, used, free and unused, and how long each has been empty",
		Long: `Lists nodes with GPUs total, used, free and unused (allocated, but no
process has run on them for VOYAGER_AGENT_GPU_UNUSED_AFTER; -o json names
the sessions holding them), and for a node that runs nothing, how long it
has been empty (from etcd: when its last session was released, or its
agent registered if later). "power down" marks a node empty for at least
the API's VOYAGER_NODE_POWER_DOWN_AFTER: with --power-down only those are
listed, an operator's hook to power machines down (Voyager powers nothing).`,
		Args: cobra.NoArgs,
		RunE: listRunE(&cf, &wf, func(_ *cobra.Command, c *client) listing[api.NodeSummary] {
			l := nodeListing(c)
			if powerDown {
				fetch := l.fetch
				l.fetch = func(ctx context.Context) ([]api.NodeSummary, error) {
					all, err := fetch(ctx)
					var out []api.NodeSummary
					for _, n := range all {
						if n.PowerDown {
							out = append(out, n)
						}
					}
					return out, err
				}
			}
			return l
		}),
	}
	cf.register(cmd, true)
	wf.register(cmd)
	cmd.Flags().BoolVar(&powerDown, "power-down", false, "list only the nodes empty long enough to power down (VOYAGER_NODE_POWER_DOWN_AFTER)")
	return cmd
}

// emptyCell says how long node n has run nothing, and whether that is
// long enough to power it down; "-" while it runs something.
func emptyCell(n api.NodeSummary) string {
	if n.EmptySince == nil {
		return "-"
	}
	s := n.EmptyFor
	if n.PowerDown {
		s += " (power down)"
	}
	return s
}

func nodeListing(c *client) listing[api.NodeSummary] {
	return listing[api.NodeSummary]{
		fetch: func(ctx context.Context) ([]api.NodeSummary, error) {
			var out struct {
				Items []api.NodeSummary `json:"items"`
			}
			err := c.do(ctx, "GET", "/api/v1/nodes", nil, &out)
			return out.Items, err
		},
		key: func(n api.NodeSummary) string { return n.Name },
		header: func(wide bool) string {
			h := "NAME\tGPUS FREE/TOTAL\tUNUSED\tMODELS\tCPU USED\tMEMORY USED\tSESSIONS\tEMPTY FOR\tSTATUS"
			if wide {
				h += "\tEMPTY SINCE\tADDRESS\tAGENT\tLABELS"
			}
			return h
		},
		row: func(n api.NodeSummary, wide bool) string {
			st := "ready"
			if n.Cordon != nil {
				st = "cordoned"
				if n.Cordon.Drain {
					st = "draining"
				}
			}
			if n.GPUs.Unhealthy > 0 {
				st += fmt.Sprintf(", %d GPU(s) unhealthy", n.GPUs.Unhealthy)
			}
			if n.Simulated {
				st += " (simulated)"
			}
			r := fmt.Sprintf("%s\t%d/%d\t%d\t%s\t%g/%g\t%d/%d MiB\t%d\t%s\t%s", n.Name, n.GPUs.Free, n.GPUs.Total, n.GPUs.Unused, models(n.Models),
				float64(n.CPUUsedMilli)/1000, float64(n.CPUMilli)/1000, n.MemoryUsedMiB, n.MemoryMiB, n.Sessions, emptyCell(n), st)
			if wide {
				var labels []string
				for _, k := range sortedMapKeys(n.Labels) {
					labels = append(labels, k+"="+n.Labels[k])
				}
				since := "-"
				if n.EmptySince != nil {
					since = n.EmptySince.Format(time.RFC3339)
				}
				r += fmt.Sprintf("\t%s\t%s\t%s\t%s", since, dash(n.Address), dash(n.Agent), dash(strings.Join(labels, ",")))
			}
			return r
		},
	}
}

// newNodeActionCmd is cordon, uncordon or drain.
func newNodeActionCmd(action, short, long string) *cobra.Command {
	var (
		cf       clientFlags
		reason   string
		deadline time.Duration
	)
	cmd := &cobra.Command{
		Use:   action + " NAME",
		Short: short,
		Long:  long,
		Args:  exactArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			c, err := cf.client()
			if len(args) > 0 || err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
			defer cancel()
			nodes, _ := nodeListing(c).fetch(ctx)
			var out []cobra.Completion
			for _, n := range nodes {
				out = append(out, n.Name)
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			node := args[0]
			var body any
			if action != "uncordon" {
				req := api.CordonRequest{Reason: reason}
				if cmd.Flags().Changed("deadline") {
					if deadline < 0 {
						fmt.Fprintf(cmd.ErrOrStderr(), "%s: invalid --deadline %s: want 0 or more\n", cmd.CommandPath(), deadline)
						return exitCode(exitUsage)
					}
					d := state.Duration(deadline)
					req.Deadline = &d
				}
				body = req
			}
			var out json.RawMessage
			if err := c.do(cmd.Context(), "POST", "/api/v1/nodes/"+url.PathEscape(node)+"/"+action, body, &out); err != nil {
				return cliError(cmd, err)
			}
			var v any
			if err := json.Unmarshal(out, &v); err != nil {
				return cliError(cmd, fmt.Errorf("decode answer: %w", err))
			}
			return cf.show(cmd.OutOrStdout(), v, func(w io.Writer, _ bool) {
				fmt.Fprintf(w, "node %s: %sed\n", node, strings.TrimSuffix(action, "e"))
			})
		}),
	}
	cf.register(cmd, true)
	if action != "uncordon" {
		cmd.Flags().StringVar(&reason, "reason", "", "why, for other admins")
	}
	if action == "drain" {
		cmd.Flags().DurationVar(&deadline, "deadline", 0, "let notebooks run this long (0: stop them now, after their warning; unset: the cluster's VOYAGER_DRAIN_DEADLINE)")
	}
	return cmd
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
