package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestSharedGPUE2E is GPU sharing end to end on `voyager dev` with its
// real agent on a real containerd, over a SIMULATED node of one shared
// 80 GiB GPU and one MIG-partitioned GPU: two batch sessions of one owner
// on fractions of the shared GPU both run, each sees the GPU's CDI
// stand-in device (/dev/nvidia0) and its own limits in its environment; a
// third fraction that does not fit beside them waits with a reason naming
// the room; stopping one session frees exactly its fraction, and the
// third then runs. A MIG device's session sees its own stand-in.
func TestSharedGPUE2E(t *testing.T) {
	needBinary(t)
	env, environ, dev := devWithAgent(t, "h8-share-e2e", "h8-share",
		"VOYAGER_AGENT_SIMULATE_GPUS=1xA100-80GB/shared,1xA100-80GB/mig=3g.40gb+2g.20gb+1g.10gb")
	ada, root := binaryToken(t, environ, "-sub", "ada"), binaryToken(t, environ, "-sub", "root", "-admin")

	create := func(args ...string) string {
		t.Helper()
		return createBatchAs(t, environ, env.httpAddr, ada, args...)
	}
	status := func(id string) state.Status {
		t.Helper()
		return statusAs(t, environ, env.httpAddr, ada, id)
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(200 * time.Millisecond) // polling the API for a condition, with a deadline
		}
	}
	logsOf := func(id string) string {
		_, out, _ := runBinaryAs(t, environ, env.httpAddr, ada, "session", "logs", id)
		return out
	}
	show := "ls /dev/nvidia0 && env | grep -E '^(CUDA_MPS|VOYAGER_GPU)' | sort; echo READY; sleep 600"
	s1 := create("--gpu-share", "30000", "--gpu-compute", "25", "--", "sh", "-c", show)
	s2 := create("--gpu-share", "40000", "--", "sh", "-c", show)
	for _, c := range []struct {
		id   string
		want []string
	}{
		{s1, []string{"/dev/nvidia0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30000M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "VOYAGER_GPU_SHARE_MIB=30000", "VOYAGER_GPU_SIMULATED=1"}},
		{s2, []string{"/dev/nvidia0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40000M", "VOYAGER_GPU_SHARE_MIB=40000", "VOYAGER_GPU_SIMULATED=1"}},
	} {
		waitUntil(c.id+" running with its limits printed", func() bool { return strings.Contains(logsOf(c.id), "READY") })
		out := logsOf(c.id)
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s's output lacks %q:\n%s", c.id, w, out)
			}
		}
		if c.id == s2 && strings.Contains(out, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") {
			t.Errorf("%s asked for no compute share but got one:\n%s", c.id, out)
		}
	}
	if st1, st2 := status(s1), status(s2); len(st1.Nodes) != 1 || len(st2.Nodes) != 1 || st1.Phase != state.PhaseRunning || st2.Phase != state.PhaseRunning {
		t.Fatalf("statuses %+v and %+v; want both running", st1, st2)
	}
	// The status records the fraction as bound: GPU-hours count it so.
	if sh := status(s1).GPUShare; sh == nil || sh.MemoryMiB != 30000 || sh.GPUMemoryMiB != 81920 || sh.ComputePercent != 25 {
		t.Errorf("%s's status share %+v; want 30000 of 81920 MiB at 25%%", s1, sh)
	}
	sharedFree := func() int64 {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+env.httpAddr+"/api/v1/nodes?devices=true", nil)
		req.Header.Set("Authorization", "Bearer "+root)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		var v struct {
			Items []struct {
				Devices []struct {
					Shared    bool  `json:"shared"`
					FreeMiB   int64 `json:"freeMiB"`
					Simulated bool  `json:"simulated"`
				} `json:"devices"`
			} `json:"items"`
		}
		if err := json.Unmarshal(out, &v); err != nil || len(v.Items) != 1 {
			t.Fatalf("nodes: %v\n%s", err, out)
		}
		for _, d := range v.Items[0].Devices {
			if d.Shared {
				if !d.Simulated {
					t.Error("the simulated shared GPU is not marked simulated")
				}
				return d.FreeMiB
			}
		}
		t.Fatalf("no shared device in %s", out)
		return 0
	}
	if f := sharedFree(); f != 81920-70000 {
		t.Errorf("shared GPU has %d MiB free; want %d", f, 81920-70000)
	}

	// 20000 MiB more does not fit beside 70000 of 81920: it waits, saying why.
	s3 := create("--gpu-share", "20000", "--", "sh", "-c", show)
	waitUntil(s3+" pending with a reason", func() bool { st := status(s3); return st.Phase == state.PhasePending && st.Message != "" })
	if st := status(s3); !strings.Contains(st.Message, "20000 MiB fraction") || !strings.Contains(st.Message, "11920 MiB free") {
		t.Errorf("%s waits with %q; want the fraction and the room named", s3, st.Message)
	}

	// Stop s1: its 30000 MiB is freed, exactly, and s3 takes 20000 of it.
	if code, _, errOut := runBinaryAs(t, environ, env.httpAddr, ada, "session", "stop", s1); code != 0 {
		t.Fatalf("stop %s: %s", s1, errOut)
	}
	waitUntil(s3+" running after the stop", func() bool { return strings.Contains(logsOf(s3), "READY") })
	waitUntil(s1+" stopped", func() bool { return status(s1).Phase.Terminal() })
	if f := sharedFree(); f != 81920-40000-20000 {
		t.Errorf("after the stop the shared GPU has %d MiB free; want %d", f, 81920-60000)
	}

	// A MIG device's session sees its own CDI stand-in.
	m := create("--gpus", "1", "--mig", "2g.20gb", "--", "sh", "-c", "ls /dev/nvidia1 && echo READY; sleep 600")
	waitUntil(m+" running on its MIG device", func() bool { return strings.Contains(logsOf(m), "READY") })

	for _, id := range []string{s2, s3, m} {
		runBinaryAs(t, environ, env.httpAddr, ada, "session", "stop", id)
	}
	waitUntil("every fraction freed", func() bool { return sharedFree() == 81920 })
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}
