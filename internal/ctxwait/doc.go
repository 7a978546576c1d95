// Package ctxwait waits for a time or a context, whichever ends first: the
// one pause of every retry and back-off loop in Voyager's components.
package ctxwait
