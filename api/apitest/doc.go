// Package apitest runs an api.API for the tests of other packages (Run: its
// watchers started, synced, and stopped when the test ends) and calls an
// API over HTTP as a user (Do, Call: one JSON request with a bearer
// token).
package apitest
