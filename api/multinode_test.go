package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// mnJob is a valid multi-node job request of n machines.
func mnJob(n int) map[string]any {
	return map[string]any{"kind": "batch", "image": "voyager/jupyter:latest", "command": []string{"torchrun", "train.py"}, "nodes": n,
		"resources": map[string]any{"gpus": 1, "cpuMilli": 4000, "memoryMiB": 16384}}
}

// TestMultiNodeAdmission: a batch job on several machines is admitted with
// its queue entry asking for one part per machine (rank 0 the head, the
// rest its workers, each with the same resources); combinations that mean
// nothing (a multi-node notebook, nodes with Ray workers, more parts than
// one bind transaction holds, an unknown onPartFailure) are refused with
// the field and what would be right.
func TestMultiNodeAdmission(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	for _, c := range []struct {
		name      string
		edit      func(map[string]any)
		wantField string
		wantText  string
	}{
		{"a notebook on several machines", func(r map[string]any) { r["kind"] = "notebook" },
			"nodes", "want a batch session"},
		{"nodes and ray workers", func(r map[string]any) { r["ray"] = map[string]any{"workers": 2} },
			"nodes", "ask for one"},
		{"more parts than one transaction holds", func(r map[string]any) { r["nodes"] = 43 },
			"nodes", "got 43, want at most 42"},
		{"negative nodes", func(r map[string]any) { r["nodes"] = -2 },
			"nodes", "got -2, want 0 or 1"},
		{"an unknown part-failure policy", func(r map[string]any) { r["onPartFailure"] = "Ignore" },
			"onPartFailure", `got "Ignore", want "StopAll"`},
		{"a part-failure policy on one machine", func(r map[string]any) { r["nodes"] = 1; r["onPartFailure"] = "Continue" },
			"onPartFailure", "applies to multi-node jobs only"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := mnJob(3)
			c.edit(r)
			wantFieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusUnprocessableEntity).problem(t), c.wantField, c.wantText)
		})
	}

	// The largest job that fits one transaction is admitted, with the
	// default policy; its queue entry has one worker per further rank.
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, mnJob(42)), http.StatusCreated))
	if v.Nodes != 42 || v.OnPartFailure != state.PartFailureStopAll {
		t.Errorf("admitted job has nodes %d, onPartFailure %q; want 42, StopAll", v.Nodes, v.OnPartFailure)
	}
	q, _, err := state.Get[state.QueueEntry](context.Background(), h.cli, h.keys.Pending(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	if q.Nodes != 42 || q.Workers != 41 || q.WorkerRequest != nil || len(q.Parts()) != 42 || !reflect.DeepEqual(q.Parts()[41], q.Request) {
		t.Errorf("queue entry %+v: want nodes 42, 41 workers with the head's request", q)
	}
	if q.Ports(state.RoleHead) != 1+state.JobPeerPorts || q.Ports(state.RoleWorker) != state.JobPeerPorts {
		t.Errorf("job ports: head %d, worker %d", q.Ports(state.RoleHead), q.Ports(state.RoleWorker))
	}

	// nodes 1 is a job on one machine, as without nodes.
	r := mnJob(1)
	v = decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusCreated))
	if v.Nodes != 0 || v.OnPartFailure != "" {
		t.Errorf("one-machine job: nodes %d, onPartFailure %q; want 0 and none", v.Nodes, v.OnPartFailure)
	}
}

// TestMultiNodeJobLogs: the logs of a multi-node job are every part's,
// each line prefixed with its rank, read from each part's own agent (rank
// 0's URL in the status, the others' in their nodes' secrets); ?rank=N is
// one part's, unprefixed. A followed log of a running job waits until
// every part has published its log.
func TestMultiNodeJobLogs(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, mnJob(3)), http.StatusCreated))
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		part := strings.TrimPrefix(r.URL.Path, "/logs/")
		fmt.Fprintf(w, "hello from %s\nfollow=%s\npartial line of %s", part, r.URL.Query().Get("follow"), part)
	}))
	defer agent.Close()
	nodes := []string{"mn-a", "mn-b", "mn-c"}
	h.putStatus(state.Status{Session: v.ID, Phase: state.PhaseRunning, Nodes: nodes, URLs: map[string]string{"logs": agent.URL + "/logs/p0"}})
	putSecret := func(rank int) {
		sec := state.Secrets{Session: v.ID, Node: nodes[rank], URLs: map[string]string{"logs": fmt.Sprintf("%s/logs/p%d?key=k%d", agent.URL, rank, rank)}}
		if _, err := state.Put(context.Background(), h.cli, h.keys.Secret(nodes[rank], v.ID), sec); err != nil {
			t.Fatal(err)
		}
	}
	putSecret(1)
	p := want(t, h.do("GET", "/api/v1/sessions/"+v.ID+"/logs?follow=true", ada, nil), http.StatusServiceUnavailable).problem(t)
	if !strings.Contains(p.Detail, "missing: rank 2") {
		t.Errorf("detail %q, want rank 2 named as missing", p.Detail)
	}
	putSecret(2)
	var r response
	h.waitFor("every part's log", func() bool {
		r = h.do("GET", "/api/v1/sessions/"+v.ID+"/logs?follow=true", ada, nil)
		return r.status == http.StatusOK
	})
	lines := strings.Split(strings.TrimSuffix(string(r.body), "\n"), "\n")
	sort.Strings(lines)
	var wantLines []string
	for rank := 0; rank < 3; rank++ {
		wantLines = append(wantLines, fmt.Sprintf("[rank %d] hello from p%d", rank, rank), fmt.Sprintf("[rank %d] follow=true", rank), fmt.Sprintf("[rank %d] partial line of p%d", rank, rank))
	}
	sort.Strings(wantLines)
	if !reflect.DeepEqual(lines, wantLines) {
		t.Errorf("job logs:\n%s\nwant the lines:\n%s", strings.Join(lines, "\n"), strings.Join(wantLines, "\n"))
	}
	r = want(t, h.do("GET", "/api/v1/sessions/"+v.ID+"/logs?rank=2", ada, nil), http.StatusOK)
	if string(r.body) != "hello from p2\nfollow=false\npartial line of p2\n" {
		t.Errorf("rank 2's log %q", r.body)
	}
	want(t, h.do("GET", "/api/v1/sessions/"+v.ID+"/logs?rank=3", ada, nil), http.StatusUnprocessableEntity)
}
