// Command voyager is Voyager's single binary: every process (the all-in-one
// `voyager dev`, and later the api, placer and node agent) and the CLI are
// its subcommands.
//
// main only sets up signals and calls run; each subcommand lives in its own
// file and is listed in the table in commands.go. Configuration comes from
// VOYAGER_* environment variables and per-subcommand flags (see
// internal/config); `voyager <command> --help` lists both.
package main
