package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
)

// listing is how a list command (session list, node list, queue) fetches
// and shows its items.
type listing[T any] struct {
	// fetch reads the whole list from the API.
	fetch func(ctx context.Context) ([]T, error)
	// key names an item; --watch tells items apart by it.
	key func(T) string
	// header and row are tab-separated table lines, with more columns
	// when wide.
	header func(wide bool) string
	row    func(item T, wide bool) string
	// comparable returns what --watch compares to tell a change, where the
	// item holds something that changes by itself (an age); nil compares
	// the whole item.
	comparable func(T) T
}

// watchFlags are --watch and its interval, on every list command.
type watchFlags struct {
	watch bool
	every time.Duration
}

func (f *watchFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVarP(&f.watch, "watch", "w", false, "after the list, print each item again whenever it changes, until interrupted")
	cmd.Flags().DurationVar(&f.every, "watch-interval", 2*time.Second, "how often --watch asks the API")
}

// listRunE is the RunE of a list command: it shows the listing that l
// builds for the client, with -o and --watch.
func listRunE[T any](cf *clientFlags, wf *watchFlags, l func(cmd *cobra.Command, c *client) listing[T]) func(*cobra.Command, []string) error {
	return cliRunE(cf, func(cmd *cobra.Command, c *client, _ []string) error {
		if err := showList(cmd.Context(), cmd.OutOrStdout(), cf, *wf, l(cmd, c)); err != nil {
			return cliError(cmd, err)
		}
		return nil
	})
}

// showList prints the list once; with --watch it then prints every item
// that appears or changes, like kubectl get --watch: as table rows, or one
// JSON or YAML document each. Watching ends without error when ctx does.
func showList[T any](ctx context.Context, w io.Writer, cf *clientFlags, wf watchFlags, l listing[T]) error {
	items, err := l.fetch(ctx)
	if err != nil {
		return err
	}
	if items == nil {
		items = []T{} // JSON [] rather than null
	}
	wide := cf.output == "wide"
	table := func(w io.Writer, header bool, items []T) {
		t := newTable(w)
		if header {
			fmt.Fprintln(t, l.header(wide))
		}
		for _, it := range items {
			fmt.Fprintln(t, l.row(it, wide))
		}
		t.Flush()
	}
	if !wf.watch {
		return cf.show(w, items, func(w io.Writer, _ bool) { table(w, true, items) })
	}
	if wf.every <= 0 {
		return fmt.Errorf("invalid --watch-interval %s: want a positive duration such as 2s", wf.every)
	}
	seen := map[string]string{}
	sig := func(it T) string {
		if l.comparable != nil {
			it = l.comparable(it)
		}
		b, _ := json.Marshal(it)
		return string(b)
	}
	emit := func(changed []T, header bool) error {
		for _, it := range changed {
			switch cf.output {
			case "json":
				if err := writeJSON(w, it); err != nil {
					return err
				}
			case "yaml":
				fmt.Fprintln(w, "---")
				if err := writeYAML(w, it); err != nil {
					return err
				}
			case "name":
				if err := cf.show(w, it, nil); err != nil {
					return err
				}
			}
		}
		if !cf.structured() && (len(changed) > 0 || header) {
			table(w, header, changed)
		}
		return nil
	}
	first := true
	for {
		var changed []T
		for _, it := range items {
			k, s := l.key(it), sig(it)
			if seen[k] != s {
				seen[k] = s
				changed = append(changed, it)
			}
		}
		if err := emit(changed, first); err != nil {
			return err
		}
		first = false
		for {
			if !ctxwait.Sleep(ctx, wf.every) {
				return nil
			}
			items, err = l.fetch(ctx)
			if ctx.Err() != nil {
				return nil
			}
			var ae *apiError
			if errors.As(err, &ae) {
				return err // the API refused: asking again gets the same answer
			}
			if err == nil {
				break
			}
		}
	}
}
