package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/lifecycle"
	"github.com/voyager-gpu/voyager/state"
)

// accountantComponent is the usage accountant of `voyager placer` and
// `voyager dev`: GPU-hours of ended attempts (lifecycle.Accountant), its
// metrics on reg.
func accountantComponent(cli *clientv3.Client, cfg config.Config, log *slog.Logger, reg *prometheus.Registry) component {
	acc := lifecycle.NewAccountant(cli, lifecycle.AccountantConfig{Keys: state.MustKeys(cfg.EtcdPrefix), Logger: log})
	reg.MustRegister(acc.Collectors()...)
	return component{name: "usage", run: acc.Run}
}

func newUsageCmd() *cobra.Command {
	var (
		cf                           clientFlags
		period, from, to, by, format string
		team, user                   string
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "GPU-hours by team, user and day (yours; everyone's for admins)",
		Long: `Prints the GPU-hours used in a period: every attempt of a session counts
its GPUs times its bound time (from its bind until it ended, was re-queued or
now), once. --period is the current month (the default), week or day in
UTC; --from and --to (dates, to exclusive) choose another span. --by groups
the rows by team, user and day.`,
		Example: `  voyager usage
  voyager usage --by team,day --period week -o csv
  voyager usage --from 2026-11-01 --to 2026-12-01 --team research -o json`,
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, _ []string) error {
			if format != "table" && format != "json" && format != "csv" {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: invalid -o %q: want table, json or csv\n", cmd.CommandPath(), format)
				return exitCode(exitUsage)
			}
			q := url.Values{}
			for k, v := range map[string]string{"period": period, "from": from, "to": to, "by": by, "team": team, "user": user} {
				if v != "" {
					q.Set(k, v)
				}
			}
			var r api.UsageReport
			if err := c.do(cmd.Context(), "GET", "/api/v1/usage?"+q.Encode(), nil, &r); err != nil {
				return cliError(cmd, err)
			}
			switch format {
			case "json":
				return writeJSON(cmd.OutOrStdout(), r)
			case "csv":
				return writeUsageCSV(cmd.OutOrStdout(), r)
			}
			writeUsageTable(cmd.OutOrStdout(), r)
			return nil
		}),
	}
	cf.register(cmd, false)
	fs := cmd.Flags()
	fs.StringVarP(&format, "output", "o", "table", "output: table, json or csv")
	fs.StringVar(&period, "period", "", "month (default), week or day: the current one, in UTC")
	fs.StringVar(&from, "from", "", "first UTC date, e.g. 2026-11-01 (instead of --period)")
	fs.StringVar(&to, "to", "", "the UTC date after the last (default: tomorrow)")
	fs.StringVar(&by, "by", "", "group rows by team, user and day, comma-separated (default team,user)")
	fs.StringVar(&team, "team", "", "only this team and the teams below it")
	fs.StringVar(&user, "user", "", "only this user (admins)")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"table", "json", "csv"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("period", cobra.FixedCompletions([]cobra.Completion{state.PeriodMonth, state.PeriodWeek, state.PeriodDay}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// usageColumns are the grouping columns of r, then the numbers.
func usageColumns(r api.UsageReport) []string {
	cols := make([]string, 0, len(r.By)+2)
	for _, b := range r.By {
		cols = append(cols, strings.ToUpper(b))
	}
	return append(cols, "GPU-HOURS", "GPU-SECONDS")
}

func usageCells(r api.UsageReport, row api.UsageRow) []string {
	var out []string
	for _, b := range r.By {
		switch b {
		case "team":
			out = append(out, row.Team)
		case "user":
			out = append(out, row.User)
		case "day":
			out = append(out, row.Day)
		}
	}
	return append(out, strconv.FormatFloat(row.GPUHours, 'f', 3, 64), strconv.FormatFloat(row.GPUSeconds, 'f', 3, 64))
}

func writeUsageTable(w io.Writer, r api.UsageReport) {
	fmt.Fprintf(w, "GPU-hours from %s to %s (UTC)\n", r.From.Format("2006-01-02"), r.To.Format("2006-01-02"))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(usageColumns(r), "\t"))
	for _, row := range r.Rows {
		fmt.Fprintln(tw, strings.Join(usageCells(r, row), "\t"))
	}
	total := usageCells(r, r.Total)
	total[0] = "TOTAL"
	fmt.Fprintln(tw, strings.Join(total, "\t"))
	_ = tw.Flush()
}

func writeUsageCSV(w io.Writer, r api.UsageReport) error {
	cw := csv.NewWriter(w)
	cols := usageColumns(r)
	for i := range cols {
		cols[i] = strings.ToLower(strings.ReplaceAll(cols[i], "-", "_"))
	}
	if err := cw.Write(cols); err != nil {
		return err
	}
	for _, row := range r.Rows {
		if err := cw.Write(usageCells(r, row)); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// printWarnings writes the text of each Warning header (RFC 9111: code,
// agent, quoted text) of an answer to w, as "warning: text".
func printWarnings(w io.Writer, h http.Header) {
	if w == nil {
		return
	}
	for _, v := range h.Values("Warning") {
		text := v
		if i := strings.IndexByte(v, '"'); i >= 0 {
			text = strings.TrimSuffix(v[i+1:], `"`)
		}
		fmt.Fprintf(w, "warning: %s\n", text)
	}
}
