// Package doccheck holds the repository's documentation to its tree: its
// one job is the tests that every Go package has a row in README.md's
// "Layout" table, every row names a path that exists, and every package
// has a doc.go stating its job. It has no code of its own; its tests run
// in `make test` with every other package's.
package doccheck
