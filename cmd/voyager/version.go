package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// Set at build time with
// -ldflags "-X main.version=v1.2.3 -X main.commit=abc1234".
var (
	version = "dev"
	commit  = "unknown"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:         "version",
		Short:       "Print the version, commit and Go version",
		Long:        "Prints the version, the commit it was built from and the Go version.",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{envAnnotation: "none"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprint(cmd.OutOrStdout(), versionText())
			return nil
		},
	}
}
