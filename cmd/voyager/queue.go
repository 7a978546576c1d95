package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/voyager-gpu/voyager/api"
)

const queueDesc = `Shows the queue in the placer's order: position, whose (yours, or another
user's), what it asks for, and why it waits. Position 0 means it fits now
and the placer binds it on its next pass.`

func runQueue(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("voyager queue", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs, true)
	mine := fs.Bool("mine", false, "only your sessions")
	if code := cliParse(fs, "queue", "[flags]", queueDesc, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "voyager queue: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		fmt.Fprintf(stderr, "voyager queue: %v\n", err)
		return exitUsage
	}
	var out struct {
		Items []api.QueueEntry `json:"items"`
	}
	if err := c.do(ctx, "GET", "/api/v1/queue", nil, &out); err != nil {
		return cliFail(stderr, "queue", err)
	}
	items := out.Items[:0:0]
	for _, e := range out.Items {
		if !*mine || e.Mine {
			items = append(items, e)
		}
	}
	if cf.output == "json" {
		if items == nil {
			items = []api.QueueEntry{}
		}
		return printOr(stdout, stderr, "queue", items, nil)
	}
	t := newTable(stdout)
	fmt.Fprintln(t, "POS\tSESSION\tOWNER\tPRIO\tREQUEST\tWAITING\tWHY")
	for _, e := range items {
		id := e.Session
		if id == "" {
			id = "-"
		}
		fmt.Fprintf(t, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Position, id, e.Owner, e.Priority, e.Request, e.Waiting, e.Message)
	}
	t.Flush()
	return exitOK
}
