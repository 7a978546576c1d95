// Command voyager is Voyager's single binary: every process (the
// all-in-one `voyager dev`, the api, the placer and the node agent) and
// the CLI over the HTTP API are its subcommands.
//
// main only sets up signals and calls run, which builds the command tree
// with spf13/cobra (root.go) and maps what a command returns to the exit
// code. Each subcommand lives in its own file and is listed once, by its
// constructor, in root.go's subcommands; README.md in this directory says
// how to add one. Configuration comes from VOYAGER_* environment variables
// and flags derived from the table in internal/config; a flag given
// explicitly wins, and `voyager <command> --help` lists both.
package main
