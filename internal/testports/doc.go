// Package testports picks TCP ports for tests from a range the caller
// names, never the same one twice in a process: a port that was free a
// moment ago and is not held open, for a server or a container the test
// starts next. Each caller's range keeps it away from the others' and
// from the kernel's ephemeral range.
package testports
