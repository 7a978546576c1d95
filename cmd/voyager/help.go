package main

import (
	"context"
	"fmt"
	"io"
)

var helpCmd = subcommand{
	name:        "help",
	args:        "[command]",
	description: "Shows the list of commands, or the help of one command.",
}

func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := helpCmd.flagSet()
	if code := helpCmd.parse(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if fs.NArg() == 0 {
		writeUsage(stdout)
		return exitOK
	}
	c, ok := lookup(fs.Arg(0))
	if !ok {
		fmt.Fprintf(stderr, "voyager help: unknown command %q\n\n", fs.Arg(0))
		writeUsage(stderr)
		return exitUsage
	}
	return c.run(ctx, []string{"--help"}, stdout, stderr)
}
