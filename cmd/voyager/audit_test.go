package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/audit"
	"github.com/voyager-gpu/voyager/state"
)

// TestCLIAudit: voyager audit shows an admin the API's audit records as a
// table and as JSON, with filters; a user is refused.
func TestCLIAudit(t *testing.T) {
	l, err := audit.Open(audit.Options{Path: filepath.Join(t.TempDir(), "audit.jsonl")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	e, _ := newCLIEnvWith(t, func(c *api.Config) { c.Audit = l })
	_, tok, _ := voyager(t, "token", "-sub", "ada")
	_, admin, _ := voyager(t, "token", "-sub", "root", "-admin")
	if _, err := state.Put(context.Background(), e.cli, e.keys.Ledger("gpu-1"), state.Ledger{Node: "gpu-1"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envToken, strings.TrimSpace(admin))
	if code, _, errOut := voyager(t, "node", "cordon", "--reason", "fan", "gpu-1"); code != 0 {
		t.Fatalf("cordon: %d %s", code, errOut)
	}
	if code, _, _ := voyager(t, "node", "cordon", "gpu-404"); code != 1 {
		t.Fatalf("cordon of an unknown node exited %d, want 1", code)
	}
	code, out, errOut := voyager(t, "audit")
	if code != 0 || !strings.Contains(out, "ACTOR") || !strings.Contains(out, "node.cordon\tgpu-1") && !strings.Contains(out, "node.cordon") {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "gpu-1") || !strings.Contains(lines[1], "ok") || !strings.Contains(lines[2], "gpu-404") || !strings.Contains(lines[2], "refused") {
		t.Errorf("audit table:\n%s", out)
	}
	code, out, _ = voyager(t, "audit", "--outcome", "refused", "-o", "json")
	var recs []audit.Record
	if code != 0 || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 1 || recs[0].Target != "gpu-404" || recs[0].Actor != "root" || recs[0].Status != 404 {
		t.Errorf("audit --outcome refused -o json: %d %s", code, out)
	}
	if code, _, errOut := voyager(t, "audit", "--since", "soon"); code != 1 || !strings.Contains(errOut, "RFC 3339") {
		t.Errorf("audit --since soon: %d %q", code, errOut)
	}
	t.Setenv(envToken, strings.TrimSpace(tok))
	if code, _, errOut := voyager(t, "audit"); code != 1 || !strings.Contains(errOut, `needs the "admin" role`) {
		t.Errorf("audit as a user: %d %q", code, errOut)
	}
}
