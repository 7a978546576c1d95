package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

func newVolumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes"},
		Short:   "List volumes; define and delete them (admin)",
		Long: `Named volumes an operator offers to sessions: a directory on every node
(a local disk, or an NFS export each node mounts there), shared or one per
user, read-only or not, for the users and groups it names. Sessions mount
them by name: voyager run --volume NAME:/data -- ….`,
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(newVolumeListCmd(), newVolumeCreateCmd(), newVolumeDeleteCmd())
	return cmd
}

func newVolumeListCmd() *cobra.Command {
	var (
		cf clientFlags
		wf watchFlags
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the volumes you may mount (every volume for admins)",
		Args:    cobra.NoArgs,
		RunE: listRunE(&cf, &wf, func(_ *cobra.Command, c *client) listing[state.Volume] {
			return listing[state.Volume]{
				fetch: func(ctx context.Context) ([]state.Volume, error) {
					var out api.VolumeList
					err := c.do(ctx, "GET", "/api/v1/volumes", nil, &out)
					return out.Items, err
				},
				key: func(v state.Volume) string { return v.Name },
				header: func(wide bool) string {
					h := "NAME\tHOST PATH\tKIND\tACCESS\tFOR"
					if wide {
						h += "\tDESCRIPTION\tBY"
					}
					return h
				},
				row: func(v state.Volume, wide bool) string {
					kind, access, who := "shared", "read-write", "everyone"
					if v.PerUser {
						kind = "per-user"
					}
					if v.ReadOnly {
						access = "read-only"
					}
					if len(v.Users)+len(v.Groups) > 0 {
						var parts []string
						for _, u := range v.Users {
							parts = append(parts, "user:"+u)
						}
						for _, g := range v.Groups {
							parts = append(parts, "group:"+g)
						}
						who = strings.Join(parts, ",")
					}
					r := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", v.Name, v.HostPath, kind, access, who)
					if wide {
						r += fmt.Sprintf("\t%s\t%s", dash(v.Description), dash(v.By))
					}
					return r
				},
			}
		}),
	}
	cf.register(cmd, true)
	wf.register(cmd)
	return cmd
}

func newVolumeCreateCmd() *cobra.Command {
	var (
		cf clientFlags
		v  state.Volume
	)
	cmd := &cobra.Command{
		Use:     "create NAME --host-path DIR",
		Aliases: []string{"set"},
		Short:   "Define or replace a volume (admin)",
		Long: `Defines volume NAME, or replaces its definition: --host-path must exist on
every node (an NFS export the nodes mount there is fine). With --per-user it
holds {user}, e.g. /srv/results/{user}: each user gets a directory of their
own, created on first use, owned by them, mode 0700. --users and --groups
limit who may mount it (neither: everyone). Sessions that already mount it
keep the definition they were admitted with.`,
		Example: `  voyager volume create imagenet --host-path /srv/datasets/imagenet --read-only --groups vision
  voyager volume create results --host-path '/srv/results/{user}' --per-user`,
		Args: exactArgs(1),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			var out state.Volume
			if err := c.do(cmd.Context(), "PUT", "/api/v1/volumes/"+url.PathEscape(args[0]), v, &out); err != nil {
				return cliError(cmd, err)
			}
			return cf.show(cmd.OutOrStdout(), out, func(w io.Writer, _ bool) {
				fmt.Fprintf(w, "volume %s: %s\n", out.Name, out.HostPath)
			})
		}),
	}
	cf.register(cmd, true)
	fs := cmd.Flags()
	fs.StringVar(&v.HostPath, "host-path", "", "absolute directory on every node; with --per-user it holds {user}")
	fs.BoolVar(&v.PerUser, "per-user", false, "one directory per user: --host-path with {user} replaced by the session's owner")
	fs.BoolVar(&v.ReadOnly, "read-only", false, "mount it read-only into every session")
	fs.StringSliceVar(&v.Users, "users", nil, "users who may mount it (comma-separated)")
	fs.StringSliceVar(&v.Groups, "groups", nil, "groups whose members may mount it (comma-separated)")
	fs.StringVar(&v.Description, "description", "", "what it holds, for users")
	_ = cmd.MarkFlagRequired("host-path")
	return cmd
}

func newVolumeDeleteCmd() *cobra.Command {
	return newDeleteCmd("volume", "/api/v1/volumes/", "Delete a volume's definition; its files stay on the nodes (admin)")
}

// newDeleteCmd is `voyager KIND delete NAME` (alias rm): DELETE of
// prefix+NAME through the API, saying "KIND NAME: deleted".
func newDeleteCmd(kind, prefix, short string) *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "delete NAME",
		Aliases: []string{"rm"},
		Short:   short,
		Args:    exactArgs(1),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			if err := c.do(cmd.Context(), "DELETE", prefix+url.PathEscape(args[0]), nil, nil); err != nil {
				return cliError(cmd, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s: deleted\n", kind, args[0])
			return nil
		}),
	}
	cf.register(cmd, false)
	return cmd
}
