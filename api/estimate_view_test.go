package api_test

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestSessionViewCarriesEstimate: a waiting session's own view has the
// queue's estimate of its start, also for JupyterHub acting for its owner
// (the hub's pending page shows it); a running one has none.
func TestSessionViewCarriesEstimate(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("n1", "A100", 1)
	started := time.Now().UTC().Add(-30 * time.Minute).Truncate(time.Second)
	type held = struct {
		owner      string
		gpu        int
		maxRuntime time.Duration
		activity   *state.Activity
	}
	h.holdGPUs("n1", started, map[string]held{"sb": {"bob", 0, time.Hour, nil}})
	req := notebook()
	req["resources"] = map[string]any{"gpus": 1, "cpuMilli": 1000, "memoryMiB": 1024}
	one := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.token("ada"), req), 201))
	hub := h.token("jupyterhub", "service")
	h.waitFor("the estimate in the session's view", func() bool {
		v := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+one.ID, hub, nil, api.OnBehalfOfHeader, "ada"), 200))
		return v.Estimate != nil && v.Estimate.At != nil && v.Estimate.At.Equal(started.Add(time.Hour)) && v.Estimate.Message != ""
	})
}
