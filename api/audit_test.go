package api_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/audit"
)

// TestAuditLog: every kind of write through the API leaves one record in
// the audit log (who, on behalf of whom, action, target, outcome), the
// refused ones too; reads leave none; admins read it through GET
// /api/v1/audit with filters; users and services cannot; the file is JSON
// lines only its owner reads; the Prometheus counter counts records.
func TestAuditLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit", "api.jsonl")
	log, err := audit.Open(audit.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	h := newHarness(t, harnessOpts{audit: log})
	ada, root, hub := h.token("ada"), h.token("root", "admin"), h.token("jupyterhub", "service")
	h.addNode("gpu-1", "A100", 2)

	// Users' writes.
	s := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	want(t, h.do("POST", "/api/v1/sessions/"+s.ID+"/extend", ada, map[string]any{"by": "1h"}), http.StatusConflict)
	want(t, h.do("POST", "/api/v1/sessions/"+s.ID+"/stop", ada, nil), http.StatusAccepted)
	arr := decode[api.ArrayView](t, want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil)), http.StatusCreated))
	want(t, h.do("POST", "/api/v1/arrays/"+arr.ID+"/stop", ada, nil), http.StatusAccepted)
	// A service acting for a user.
	bs := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", hub, notebook(), api.OnBehalfOfHeader, "bob"), http.StatusCreated))
	want(t, h.do("DELETE", "/api/v1/sessions/"+bs.ID, hub, nil, api.OnBehalfOfHeader, "bob"), http.StatusAccepted)
	// Admins' writes.
	want(t, h.do("POST", "/api/v1/nodes/gpu-1/cordon", root, map[string]any{"reason": "fan"}), http.StatusOK)
	want(t, h.do("POST", "/api/v1/nodes/gpu-1/uncordon", root, nil), http.StatusOK)
	want(t, h.do("POST", "/api/v1/nodes/gpu-1/drain", root, map[string]any{"deadline": "1h"}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/profiles/small", root, map[string]any{"kind": "notebook"}), http.StatusOK)
	want(t, h.do("DELETE", "/api/v1/profiles/small", root, nil), http.StatusNoContent)
	want(t, h.do("PUT", "/api/v1/quotas/users/ada", root, map[string]any{"gpus": 4}), http.StatusOK)
	want(t, h.do("DELETE", "/api/v1/quotas/users/ada", root, nil), http.StatusNoContent)
	want(t, h.do("PUT", "/api/v1/volumes/data", root, map[string]any{"hostPath": "/srv/data"}), http.StatusOK)
	want(t, h.do("DELETE", "/api/v1/volumes/data", root, nil), http.StatusNoContent)
	// Refused writes: not an admin, no token, an unknown node.
	want(t, h.do("PUT", "/api/v1/quotas/users/ada", ada, map[string]any{"gpus": 99}), http.StatusForbidden)
	want(t, h.do("POST", "/api/v1/sessions", "", notebook()), http.StatusUnauthorized)
	want(t, h.do("POST", "/api/v1/nodes/gpu-9/cordon", root, nil), http.StatusNotFound)
	// Reads are not recorded.
	want(t, h.do("GET", "/api/v1/sessions/"+s.ID, ada, nil), http.StatusOK)
	want(t, h.do("GET", "/api/v1/quotas", root, nil), http.StatusOK)

	type rec struct{ actor, onBehalf, action, target, outcome string }
	wantRecs := []rec{
		{"ada", "", "session.create", s.ID, audit.OK},
		{"ada", "", "session.extend", s.ID, audit.Refused},
		{"ada", "", "session.stop", s.ID, audit.OK},
		{"ada", "", "array.create", arr.ID, audit.OK},
		{"ada", "", "array.stop", arr.ID, audit.OK},
		{"jupyterhub", "bob", "session.create", bs.ID, audit.OK},
		{"jupyterhub", "bob", "session.stop", bs.ID, audit.OK},
		{"root", "", "node.cordon", "gpu-1", audit.OK},
		{"root", "", "node.uncordon", "gpu-1", audit.OK},
		{"root", "", "node.drain", "gpu-1", audit.OK},
		{"root", "", "profile.put", "small", audit.OK},
		{"root", "", "profile.delete", "small", audit.OK},
		{"root", "", "quota.put", "users/ada", audit.OK},
		{"root", "", "quota.delete", "users/ada", audit.OK},
		{"root", "", "volume.put", "data", audit.OK},
		{"root", "", "volume.delete", "data", audit.OK},
		{"ada", "", "quota.put", "users/ada", audit.Refused},
		{"", "", "session.create", "", audit.Refused},
		{"root", "", "node.cordon", "gpu-9", audit.Refused},
	}
	got := decode[api.AuditList](t, want(t, h.do("GET", "/api/v1/audit", root, nil), http.StatusOK))
	if len(got.Items) != len(wantRecs) || got.More {
		t.Fatalf("%d records (more %v), want %d: %+v", len(got.Items), got.More, len(wantRecs), got.Items)
	}
	for i, w := range wantRecs {
		r := got.Items[i]
		if g := (rec{r.Actor, r.OnBehalfOf, r.Action, r.Target, r.Outcome}); g != w {
			t.Errorf("record %d is %+v, want %+v", i, g, w)
		}
		if r.Time.IsZero() || r.Status == 0 || r.Method == "" || r.Path == "" {
			t.Errorf("record %d lacks when or what: %+v", i, r)
		}
		if r.Outcome == audit.Refused && r.Detail == "" {
			t.Errorf("refused record %d says not why: %+v", i, r)
		}
	}
	if r := got.Items[16]; !strings.Contains(r.Detail, `needs the "admin" role`) || r.Status != http.StatusForbidden {
		t.Errorf("the refused quota write is recorded as %+v", r)
	}

	// Filters.
	only := decode[api.AuditList](t, want(t, h.do("GET", "/api/v1/audit?actor=bob&action=session.", root, nil), http.StatusOK))
	if len(only.Items) != 2 || only.Items[0].OnBehalfOf != "bob" {
		t.Errorf("actor=bob&action=session. gave %+v", only.Items)
	}
	last := decode[api.AuditList](t, want(t, h.do("GET", "/api/v1/audit?outcome=refused&limit=1", root, nil), http.StatusOK))
	if len(last.Items) != 1 || !last.More || last.Items[0].Target != "gpu-9" {
		t.Errorf("outcome=refused&limit=1 gave %+v", last)
	}
	want(t, h.do("GET", "/api/v1/audit?since=yesterday", root, nil), http.StatusUnprocessableEntity)

	// Users and services cannot read it.
	want(t, h.do("GET", "/api/v1/audit", ada, nil), http.StatusForbidden)
	want(t, h.do("GET", "/api/v1/audit", hub, nil, api.OnBehalfOfHeader, "root"), http.StatusForbidden)

	// The file: JSON lines, one per record, for its owner alone.
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode %v, want 0600", st.Mode().Perm())
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("line %d is not JSON: %v", lines+1, err)
		}
	}
	if lines != len(wantRecs) {
		t.Errorf("%d lines, want %d (reads of the log are not recorded)", lines, len(wantRecs))
	}
	// No secret leaves a trace: no token is in the log.
	if b, _ := os.ReadFile(path); strings.Contains(string(b), ada) || strings.Contains(string(b), hub) || strings.Contains(string(b), root) {
		t.Error("the audit log holds a token")
	}

	m := gather(t, h.api)
	for _, line := range []string{
		`voyager_audit_records_total{action="session.create",outcome="ok"} 2`,
		`voyager_audit_records_total{action="quota.put",outcome="refused"} 1`,
	} {
		if !strings.Contains(m, line) {
			t.Errorf("metrics lack %s", line)
		}
	}
}

// TestAuditOff: without a log, writes work and the read says there is
// none.
func TestAuditOff(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	root := h.token("root", "admin")
	want(t, h.do("PUT", "/api/v1/profiles/small", root, map[string]any{"kind": "notebook"}), http.StatusOK)
	p := want(t, h.do("GET", "/api/v1/audit", root, nil), http.StatusNotFound).problem(t)
	if !strings.Contains(p.Detail, "VOYAGER_API_AUDIT_LOG") {
		t.Errorf("detail %q", p.Detail)
	}
}
