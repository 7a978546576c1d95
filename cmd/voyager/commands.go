package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/voyager-gpu/voyager/internal/config"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // bad command line or configuration
)

// command is one subcommand. run gets the arguments after the subcommand's
// name and returns the process's exit code.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands is the table of subcommands, in the order help lists them. Each
// has its own file (dev.go, version.go, …).
//
// Later issues add their rows here, one file each:
//
//	processes: api (api.go), agent (agent.go)
//	CLI over the HTTP API: session (session.go), run (run.go),
//	node (node.go), token (token.go)
func commands() []command {
	return []command{
		{name: "dev", summary: "run an all-in-one Voyager on this machine (embedded etcd, HTTP server)", run: runDev},
		{name: "placer", summary: "run a placer: bind pending sessions to GPUs (any number may run)", run: runPlacer},
		{name: "agent", summary: "run the node agent of this GPU machine: its GPUs, its containers", run: runAgent},
		{name: "api", summary: "run the HTTP API (JWT-protected; any number may run)", run: runAPI},
		{name: "session", summary: "create, list, get, stop, wait for sessions and read their logs", run: runSession},
		{name: "run", summary: "run a batch command on GPUs and exit with its exit code", run: runRun},
		{name: "node", summary: "list nodes; cordon, uncordon and drain them (admin)", run: runNode},
		{name: "queue", summary: "show the queue: what is ahead of you and why", run: runQueue},
		{name: "certs", summary: "create a CA and the certificates of etcd members, components and nodes", run: runCerts},
		{name: "etcd-roles", summary: "set up or check Voyager's etcd users and roles (least rights per component)", run: runEtcdRoles},
		{name: "token", summary: "print a development token signed with the configured secret", run: runToken},
		{name: "version", summary: "print the version, commit and Go version", run: runVersion},
		{name: "help", summary: "show help for voyager or one command", run: runHelp},
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// run dispatches args (os.Args[1:]) to a subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		writeUsage(stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		name = "help"
	case "-version", "--version":
		name = "version"
	}
	c, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "voyager: unknown command %q\n\n", args[0])
		writeUsage(stderr)
		return exitUsage
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func writeUsage(w io.Writer) {
	fmt.Fprint(w, "Voyager gives researchers GPU sessions that are theirs alone.\n\n")
	fmt.Fprint(w, "Usage: voyager <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun `voyager <command> --help` for its flags and environment variables.\n")
}

// subcommand describes a subcommand's command line for its --help.
type subcommand struct {
	name        string   // as typed after voyager
	args        string   // positional arguments, for the usage line
	description string   // one paragraph
	envs        []string // config variables it reads; nil means none
	allEnvs     bool     // it reads every config variable
}

// flagSet returns a FlagSet for sc with the config flags it reads
// registered.
func (sc subcommand) flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("voyager "+sc.name, flag.ContinueOnError)
	fs.Usage = func() {} // parse reports usage itself, on the right stream
	switch {
	case sc.allEnvs:
		config.AddFlags(fs)
	case len(sc.envs) > 0:
		config.AddFlags(fs, sc.envs...)
	}
	return fs
}

// parse parses args into fs. On --help it writes the help to stdout and
// returns exitOK; on a bad flag it writes the error and help to stderr and
// returns exitUsage; else it returns -1 and the caller goes on.
func (sc subcommand) parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) int {
	fs.SetOutput(stderr)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		sc.writeHelp(fs, stdout)
		return exitOK
	case err != nil:
		fmt.Fprintln(stderr)
		sc.writeHelp(fs, stderr)
		return exitUsage
	case sc.args == "" && fs.NArg() > 0:
		fmt.Fprintf(stderr, "voyager %s: unexpected argument %q\n\n", sc.name, fs.Arg(0))
		sc.writeHelp(fs, stderr)
		return exitUsage
	}
	return -1
}

func (sc subcommand) writeHelp(fs *flag.FlagSet, w io.Writer) {
	usage := "voyager " + sc.name
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		usage += " [flags]"
	}
	if sc.args != "" {
		usage += " " + sc.args
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", usage, strings.TrimSpace(sc.description))
	fmt.Fprint(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprint(w, "  -help\n    \tshow this help\n")
	if sc.allEnvs || len(sc.envs) > 0 {
		fmt.Fprint(w, "\nEnvironment (a flag given explicitly wins over its variable):\n")
		if sc.allEnvs {
			config.WriteEnvHelp(w)
		} else {
			config.WriteEnvHelp(w, sc.envs...)
		}
	} else {
		fmt.Fprint(w, "\nEnvironment: none.\n")
	}
}

// writeConfigError writes a config.Load error, one invalid setting a line.
func writeConfigError(w io.Writer, name string, err error) {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		fmt.Fprintf(w, "voyager %s: %v\n", name, e)
	}
}
