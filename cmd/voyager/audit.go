package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/audit"
)

const auditLong = `Shows the API's audit log (admins only): one line per state-changing call —
session create, stop and extend, arrays, cordons and drains, profiles,
quotas and volumes, whatever its outcome — with who made it, the user a
service (JupyterHub) acted for, the object and why a refused call was
refused. Oldest first, the newest --limit that match.

Each API process keeps its own log (VOYAGER_API_AUDIT_LOG, JSON lines,
rotated): behind a load balancer, ask each replica, or read the files.`

func newAuditCmd() *cobra.Command {
	var (
		cf clientFlags
		wf watchFlags
		q  auditQuery
	)
	cmd := &cobra.Command{
		Use:     "audit",
		Short:   "Show the audit log of state-changing API calls (admin)",
		Long:    auditLong,
		Example: "  voyager audit --since 24h\n  voyager audit --actor ada --action session.\n  voyager audit --outcome refused -o json",
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE:    listRunE(&cf, &wf, func(_ *cobra.Command, c *client) listing[audit.Record] { return auditListing(c, q) }),
	}
	cf.register(cmd, true)
	wf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&q.since, "since", "", "only records from then on: an RFC 3339 time or a duration before now (24h)")
	f.StringVar(&q.until, "until", "", "only records before then: an RFC 3339 time or a duration before now")
	f.StringVar(&q.actor, "actor", "", "only records of this subject (as the actor, or the user a service acted for)")
	f.StringVar(&q.action, "action", "", "only this action (session.create), or actions starting with a prefix ending in '.' (session.)")
	f.StringVar(&q.target, "target", "", "only records about this session id, node, profile, volume or scope/name")
	f.StringVar(&q.outcome, "outcome", "", "only ok, refused or failed calls")
	f.IntVar(&q.limit, "limit", 1000, "the newest this many records that match (at most 10000)")
	return cmd
}

// auditQuery is voyager audit's filter flags.
type auditQuery struct {
	since, until, actor, action, target, outcome string
	limit                                        int
}

func (q auditQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"since": q.since, "until": q.until, "actor": q.actor, "action": q.action, "target": q.target, "outcome": q.outcome} {
		if s != "" {
			v.Set(k, s)
		}
	}
	v.Set("limit", fmt.Sprint(q.limit))
	return v
}

func auditListing(c *client, q auditQuery) listing[audit.Record] {
	return listing[audit.Record]{
		fetch: func(ctx context.Context) ([]audit.Record, error) {
			var out api.AuditList
			err := c.do(ctx, "GET", "/api/v1/audit?"+q.values().Encode(), nil, &out)
			return out.Items, err
		},
		key: func(r audit.Record) string {
			return r.Time.String() + "/" + r.Actor + "/" + r.Action + "/" + r.Target
		},
		header: func(wide bool) string {
			h := "TIME\tACTOR\tFOR\tACTION\tTARGET\tOUTCOME\tSTATUS"
			if wide {
				h += "\tREMOTE\tMS\tDETAIL"
			}
			return h
		},
		row: func(r audit.Record, wide bool) string {
			s := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%d", r.Time.UTC().Format(timeLayout), dash(r.Actor), dash(r.OnBehalfOf), r.Action, dash(r.Target), r.Outcome, r.Status)
			if wide {
				s += fmt.Sprintf("\t%s\t%.1f\t%s", dash(r.Remote), r.DurationMS, dash(strings.ReplaceAll(r.Detail, "\t", " ")))
			}
			return s
		},
	}
}
