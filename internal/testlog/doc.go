// Package testlog holds what tests share for reading a log that something
// else writes while they run.
package testlog
