// Package doccheck holds the repository's documentation to its tree: its
// one job is the test that every Go package has a row in README.md's
// "Layout" table and every row names a path that exists. It has no code
// of its own; its tests run in `make test` with every other package's.
package doccheck
