package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// createBatchAs creates a small batch session (0.2 CPU, 256 MiB, and args)
// through the CLI with token against addr and returns its name, failing
// the test on any error.
func createBatchAs(t *testing.T, environ []string, addr, token string, args ...string) string {
	t.Helper()
	code, out, errOut := runBinaryAs(t, environ, addr, token, append([]string{"session", "create", "--kind", "batch", "--cpu", "0.2", "--memory", "256", "-o", "name"}, args...)...)
	if code != 0 {
		t.Fatalf("session create %v: exit %d\n%s%s", args, code, out, errOut)
	}
	return strings.TrimSpace(out)
}

// statusAs is session id's status as `voyager session get -o json` shows
// it with token, failing the test on any error.
func statusAs(t *testing.T, environ []string, addr, token, id string) state.Status {
	t.Helper()
	code, out, errOut := runBinaryAs(t, environ, addr, token, "session", "get", id, "-o", "json")
	if code != 0 {
		t.Fatalf("session get %s: exit %d\n%s", id, code, errOut)
	}
	var v struct {
		Status state.Status `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("session get %s: %v\n%s", id, err, out)
	}
	return v.Status
}
