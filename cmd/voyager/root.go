package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/voyager-gpu/voyager/internal/config"
)

// subcommands are the constructors of voyager's subcommands, in the order
// `voyager --help` lists them within their group. Each lives in its own
// file (dev.go, session.go, …); adding one is that file plus one line here
// (see README.md in this directory).
var subcommands = []func() *cobra.Command{
	newDevCmd,
	newPlacerCmd,
	newAgentCmd,
	newFenceKeeperCmd,
	newAPICmd,
	newSessionCmd,
	newRunCmd,
	newArrayCmd,
	newNodeCmd,
	newVolumeCmd,
	newTeamCmd,
	newUsageCmd,
	newQueueCmd,
	newAuditCmd,
	newDashboardCmd,
	newSSHCmd,
	newTokenCmd,
	newImageCmd,
	newCheckCmd,
	newCertsCmd,
	newEtcdRolesCmd,
	newVersionCmd,
}

// Command groups of `voyager --help`. A command names its group in GroupID;
// one that names none is listed under "Additional Commands".
const (
	groupProcesses = "processes"
	groupCLI       = "cli"
	groupDeploy    = "deploy"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // bad command line or configuration
)

// exitCode carries a process exit code out of a command's RunE. What went
// wrong has been written to stderr already; run only turns it into the
// code.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// withCode returns nil for exitOK, else code as an error for RunE.
func withCode(code int) error {
	if code == exitOK {
		return nil
	}
	return exitCode(code)
}

// envAnnotation is the Annotations key under which a command keeps the
// environment section of its help (see usageTemplate).
const envAnnotation = "voyager-env"

func init() {
	// Help lists commands in the order of subcommands, not alphabetically.
	cobra.EnableCommandSorting = false
}

// newRootCmd builds the command tree. stdout and stderr are where every
// command writes (tests pass buffers).
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "voyager",
		Short: "GPU sessions that are theirs alone",
		Long: `Voyager gives researchers GPU sessions that are theirs alone: a Jupyter
notebook or a batch command on GPUs of a cluster, placed by etcd
transactions. The processes (dev, placer, agent, api) and the CLI over
the HTTP API are all subcommands of this one binary.

Flags may come before or after arguments; long flags take one dash or two
(-image and --image); every setting is also an environment variable
(README.md lists them; a flag given explicitly wins).`,
		Version:           version,
		SilenceErrors:     true, // run reports them, with the exit code
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: false},
		// No arguments: the overview, on stderr, as a usage error.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			cmd.SetOut(cmd.ErrOrStderr())
			_ = cmd.Usage()
			return exitCode(exitUsage)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate(versionText())
	root.SetUsageTemplate(root.UsageTemplate() + usageEnvTemplate)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	root.AddGroup(
		&cobra.Group{ID: groupProcesses, Title: "Processes (run on the cluster's machines):"},
		&cobra.Group{ID: groupCLI, Title: "Using Voyager (the CLI over the HTTP API):"},
		&cobra.Group{ID: groupDeploy, Title: "Deploying (certificates, etcd users and roles; docs/deployment.md):"},
	)
	for _, newCmd := range subcommands {
		root.AddCommand(newCmd())
	}
	root.SetHelpCommand(newHelpCmd(root))
	return root
}

// usageEnvTemplate follows cobra's usage with the environment a command
// reads, kept in its envAnnotation.
const usageEnvTemplate = `{{with index .Annotations "voyager-env"}}
Environment{{if ne . "none"}} (a flag given explicitly wins over its variable):
{{.}}{{else}}: none.
{{end}}{{end}}`

// run builds the command tree, runs the command args names and returns
// the process's exit code: the command's own, or exitUsage for a command
// line cobra refused (unknown command or flag, wrong arguments).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(normalizeArgs(root, args))
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code)
	}
	fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
	explainUsageError(stderr, cmd, err)
	fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	return exitUsage
}

// normalizeArgs turns single-dash long flags (-image x, -sub=ada), which
// Go's flag package accepted and scripts and docs still use, into pflag's
// double-dash form. Only names that are long flags of the command being
// parsed are rewritten, so shorthands (-o json, -f, -ojson) keep their
// meaning; nothing after "--" is touched.
func normalizeArgs(root *cobra.Command, args []string) []string {
	out := make([]string, 0, len(args))
	cmd := root
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if !strings.HasPrefix(a, "-") {
			if c := childNamed(cmd, a); c != nil {
				cmd = c
			}
			out = append(out, a)
			continue
		}
		if strings.HasPrefix(a, "--") || len(a) <= 2 {
			out = append(out, a)
			if f := lookupFlag(cmd, a); f != nil && f.NoOptDefVal == "" && !strings.Contains(a, "=") && i+1 < len(args) {
				i++ // the flag's value, never a subcommand's name
				out = append(out, args[i])
			}
			continue
		}
		name, _, hasValue := strings.Cut(a[1:], "=")
		f := lookupFlag(cmd, "--"+name)
		if f == nil {
			out = append(out, a) // pflag's shorthand rules apply
			continue
		}
		out = append(out, "-"+a)
		if !hasValue && f.NoOptDefVal == "" && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out
}

// lookupFlag finds the flag a (--name, --name=v or -x) names on cmd,
// inherited ones and help included.
func lookupFlag(cmd *cobra.Command, a string) *pflag.Flag {
	cmd.InitDefaultHelpFlag()
	if cmd == cmd.Root() {
		cmd.InitDefaultVersionFlag()
	}
	fs := []*pflag.FlagSet{cmd.Flags(), cmd.InheritedFlags()}
	if name, ok := strings.CutPrefix(a, "--"); ok {
		name, _, _ = strings.Cut(name, "=")
		for _, s := range fs {
			if f := s.Lookup(name); f != nil {
				return f
			}
		}
		return nil
	}
	if len(a) == 2 {
		for _, s := range fs {
			if f := s.ShorthandLookup(a[1:]); f != nil {
				return f
			}
		}
	}
	return nil
}

// exactArgs wants n arguments, named in the command's Use line.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("want %d argument(s) (%s), got %d", n, strings.Join(strings.Fields(cmd.Use)[1:], " "), len(args))
		}
		return nil
	}
}

func childNamed(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

// newHelpCmd is `voyager help [command…]`: the help of a command, or a
// usage error naming an unknown one (cobra's own answers those with the
// overview and success).
func newHelpCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Show help for voyager or one command",
		Long:  "Shows the list of commands, or the help of one command (voyager help session create).",
		ValidArgsFunction: func(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			c, _, err := root.Find(args)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []cobra.Completion
			for _, s := range c.Commands() {
				if s.IsAvailableCommand() {
					names = append(names, cobra.CompletionWithDesc(s.Name(), s.Short))
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err == nil && len(rest) > 0 {
				err = fmt.Errorf("unknown command %q", strings.Join(rest, " "))
			}
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "voyager help: %v\n\n", err)
				root.SetOut(cmd.ErrOrStderr())
				_ = root.Usage()
				return exitCode(exitUsage)
			}
			return target.Help()
		},
	}
}

// withSettings registers on cmd the flags of the settings named by envs
// (every setting when envs is empty) and documents their variables in its
// help. Its RunE reads them with loadConfig.
func withSettings(cmd *cobra.Command, envs ...string) *cobra.Command {
	config.AddFlags(cmd.Flags(), envs...)
	var b strings.Builder
	config.WriteEnvHelp(&b, envs...)
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[envAnnotation] = b.String()
	return cmd
}

// loadConfig reads the settings from the environment and cmd's flags (a
// flag given explicitly wins). Invalid settings are written to stderr, one
// a line, and the error is exitCode(exitUsage).
func loadConfig(cmd *cobra.Command) (config.Config, error) {
	cfg, err := config.Load(os.Environ(), cmd.Flags())
	if err != nil {
		writeConfigError(cmd.ErrOrStderr(), cmd.CommandPath(), err)
		return cfg, exitCode(exitUsage)
	}
	return cfg, nil
}

// loadClusterConfig is loadConfig for the processes that join a cluster
// (api, placer, agent): they need VOYAGER_ETCD_ENDPOINTS.
func loadClusterConfig(cmd *cobra.Command) (config.Config, error) {
	cfg, err := loadConfig(cmd)
	if err == nil {
		err = cfg.RequireEndpoints()
		if err != nil {
			writeConfigError(cmd.ErrOrStderr(), cmd.CommandPath(), err)
			err = exitCode(exitUsage)
		}
	}
	return cfg, err
}

// writeConfigError writes a config error, one invalid setting a line.
func writeConfigError(w io.Writer, path string, err error) {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		fmt.Fprintf(w, "%s: %v\n", path, e)
	}
}

// versionText is what `voyager version` and `voyager --version` print.
func versionText() string {
	return fmt.Sprintf("version: %s\ncommit:  %s\ngo:      %s %s/%s\n",
		version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
