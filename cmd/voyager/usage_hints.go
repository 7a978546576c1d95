package main

import (
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
)

var unknownCommandRE = regexp.MustCompile(`^unknown command "([^"]*)"`)

// explainUsageError follows cobra's refusal of a command line (err, for
// cmd) with what the person most likely meant: the commands named like a
// mistyped one, or that a command to run goes after "--".
func explainUsageError(w io.Writer, cmd *cobra.Command, err error) {
	msg := err.Error()
	if m := unknownCommandRE.FindStringSubmatch(msg); m != nil {
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2 // cobra's own default
		}
		if s := cmd.SuggestionsFor(m[1]); len(s) > 0 {
			fmt.Fprintf(w, "Did you mean this?\n\t%s\n", strings.Join(s, "\n\t"))
		}
		return
	}
	if (strings.HasPrefix(msg, "unknown shorthand flag") || strings.HasPrefix(msg, "unknown flag")) && strings.Contains(cmd.Use, "-- COMMAND") {
		fmt.Fprintf(w, "The command to run goes after --, so that its own flags are not read as %s's: %s [flags] -- sh -c 'echo hi'\n",
			cmd.CommandPath(), cmd.CommandPath())
	}
}

// stopSessions stops every session of ids, in order, and reports each:
// one StopResult for -o json|yaml with one ID, a list with several.
func stopSessions(cmd *cobra.Command, c *client, cf *clientFlags, ids []string) error {
	var results []api.StopResult
	failed := false
	for _, id := range ids {
		var r api.StopResult
		if err := c.do(cmd.Context(), "POST", "/api/v1/sessions/"+url.PathEscape(id)+"/stop", nil, &r); err != nil {
			cliFail(cmd.ErrOrStderr(), "session stop "+id, err)
			failed = true
			continue
		}
		results = append(results, r)
	}
	var v any = results
	if len(ids) == 1 && len(results) == 1 {
		v = results[0]
	}
	if len(results) > 0 || len(ids) > 1 {
		if err := cf.show(cmd.OutOrStdout(), v, func(w io.Writer, _ bool) {
			for _, r := range results {
				fmt.Fprintf(w, "%s: %s (phase %s)\n", r.Session.ID, r.Outcome, r.Session.Status.Phase)
			}
		}); err != nil {
			return cliError(cmd, err)
		}
	}
	if failed {
		return exitCode(exitError)
	}
	return nil
}
