package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
)

const queueLong = `Shows the queue in the placer's order: position, whose (yours, or another
user's), what it asks for, and why it waits. Position 0 means it fits now
and the placer binds it on its next pass.`

func newQueueCmd() *cobra.Command {
	var (
		cf   clientFlags
		wf   watchFlags
		mine bool
	)
	cmd := &cobra.Command{
		Use:     "queue",
		Short:   "Show the queue: what is ahead of you and why",
		Long:    queueLong,
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE:    listRunE(&cf, &wf, func(_ *cobra.Command, c *client) listing[api.QueueEntry] { return queueListing(c, mine) }),
	}
	cf.register(cmd, true)
	wf.register(cmd)
	cmd.Flags().BoolVar(&mine, "mine", false, "only your sessions")
	return cmd
}

func queueListing(c *client, mine bool) listing[api.QueueEntry] {
	return listing[api.QueueEntry]{
		fetch: func(ctx context.Context) ([]api.QueueEntry, error) {
			var out struct {
				Items []api.QueueEntry `json:"items"`
			}
			if err := c.do(ctx, "GET", "/api/v1/queue", nil, &out); err != nil {
				return nil, err
			}
			items := out.Items[:0:0]
			for _, e := range out.Items {
				if !mine || e.Mine {
					items = append(items, e)
				}
			}
			return items, nil
		},
		key: func(e api.QueueEntry) string { return e.Session + "/" + e.Owner + "/" + e.Created.String() },
		header: func(wide bool) string {
			if wide {
				return "POS\tSESSION\tOWNER\tPRIO\tREQUEST\tWAITING\tWHY\tREASON\tCREATED"
			}
			return "POS\tSESSION\tOWNER\tPRIO\tREQUEST\tWAITING\tWHY"
		},
		row: func(e api.QueueEntry, wide bool) string {
			r := itoa(e.Position) + "\t" + dash(e.Session) + "\t" + e.Owner + "\t" + itoa(e.Priority) + "\t" + e.Request + "\t" + e.Waiting + "\t" + e.Message
			if wide {
				r += "\t" + dash(e.Reason) + "\t" + e.Created.UTC().Format(timeLayout)
			}
			return r
		},
		comparable: func(e api.QueueEntry) api.QueueEntry {
			e.Waiting = "" // grows by itself
			return e
		},
	}
}
