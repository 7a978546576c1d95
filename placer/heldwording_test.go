package placer

import (
	"strings"
	"testing"
	"time"
)

// TestHeldNodeReasonForNoGPURequest: the researcher's day of issue 37. A
// small node runs one notebook; a 4-GPU request that has waited past
// ReserveAfter holds the node. A job that asks for no GPU at all waits
// too, and its reason says so plainly: which request size the node is held
// for, and that a held node takes nothing else until that request starts,
// not even a request for no GPUs. A 1-GPU request kept off the node is told
// what the node is held for, without the no-GPU clause. A hold restored
// from etcd (the snapshot's Held, from an earlier pass) says the same.
func TestHeldNodeReasonForNoGPURequest(t *testing.T) {
	nodes := []NodeView{holding(view(gpuNode("gpu-1", 4, "A100")), "notebook", "carol", 1)}
	big := req("big", "ada", 4, time.Hour)
	big.Entry.Request.GPUModel = "A100"
	cpuJob := req("cpu-job", "bob", 0, 0)
	cpuJob.Entry.Request.CPUMilli, cpuJob.Entry.Request.MemoryMiB = 500, 1024
	oneGPU := req("one-gpu", "dan", 1, 0)

	wantHeld := "node gpu-1 is held for another waiting request (4×A100)"
	wantPlain := "; until it starts nothing else is placed on gpu-1, not even a request for no GPUs like this one"
	check := func(how string, p *Plan) {
		t.Helper()
		if len(p.Bound) != 0 || p.Reserved["gpu-1"] != "big" {
			t.Fatalf("%s: bound %+v, reserved %v; want nothing bound and gpu-1 held for big", how, p.Bound, p.Reserved)
		}
		msgs := map[string]string{}
		for _, w := range p.Waiting {
			msgs[w.Pending.Entry.Session] = w.Message
		}
		if m := msgs["cpu-job"]; m != "waiting for 0.5 cores CPU and 1024 MiB memory: "+wantHeld+wantPlain {
			t.Errorf("%s: the no-GPU job waits with %q; want it to say plainly that the held node takes nothing else, a request for no GPUs included", how, m)
		}
		if m := msgs["one-gpu"]; !strings.HasSuffix(m, ": "+wantHeld) {
			t.Errorf("%s: the 1-GPU request waits with %q; want it to end %q", how, m, wantHeld)
		}
		t.Logf("%s: cpu-job: %s", how, msgs["cpu-job"])
	}

	// The hold is taken in this pass (big has waited an hour, past
	// ReserveAfter/4).
	check("hold taken", NewPlan(snap(nodes, big, cpuJob, oneGPU), PlanOptions{ReserveAfter: 5 * time.Minute}))

	// The hold comes from an earlier pass, through the snapshot.
	s := snap(nodes, big, cpuJob, oneGPU)
	s.Held = map[string]string{"gpu-1": "big"}
	check("hold restored", NewPlan(s, PlanOptions{ReserveAfter: 5 * time.Minute}))
}
