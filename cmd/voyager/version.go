package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
)

// Set at build time with
// -ldflags "-X main.version=v1.2.3 -X main.commit=abc1234".
var (
	version = "dev"
	commit  = "unknown"
)

var versionCmd = subcommand{
	name:        "version",
	description: "Prints the version, the commit it was built from and the Go version.",
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := versionCmd.flagSet()
	if code := versionCmd.parse(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	fmt.Fprintf(stdout, "version: %s\ncommit:  %s\ngo:      %s %s/%s\n",
		version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return exitOK
}
