// Package config reads Voyager's process settings: environment variables
// (VOYAGER_*) with defaults, overridden by command-line flags given
// explicitly.
//
// The Config struct is the single source of truth for the settings. Its
// struct tags name each variable (env), its default (envDefault, or
// docDefault where the default is computed), and its meaning (doc); flags,
// --help text and the table in README.md are derived from, or checked
// against, those tags. Every invalid value is reported with the variable (or
// flag) that carried it, the value, and what would be valid.
package config
