package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// goodputStandIn is a job that first plants, in its report directory, a
// symbolic link to a path on the node (absolute: the agent would resolve
// it on the host, where it names a file of valid report the job cannot
// see), then, once the test lets it ($HOME/go), replaces it with a report
// of its own at its size, written whole and renamed into place.
const goodputStandIn = `log=$HOME/goodput.log
ln -s "$PLANTED" "$VOYAGER_GOODPUT_FILE" && echo "planted $(readlink $VOYAGER_GOODPUT_FILE)" >> $log
while [ ! -f $HOME/go ]; do sleep 1; done
rm -f "$VOYAGER_GOODPUT_FILE"
printf '{"size":%s,"samplesPerSecond":1234.5,"efficiency":0.9}' "$VOYAGER_GPUS" > "$VOYAGER_GOODPUT_FILE.tmp" && mv "$VOYAGER_GOODPUT_FILE.tmp" "$VOYAGER_GOODPUT_FILE" && echo written >> $log
trap 'exit 0' TERM
while :; do sleep 1 & wait $!; done`

// TestGoodputReportE2E: on `voyager dev` with a real containerd and a
// SIMULATED node of 8 GPUs, an elastic job writes its goodput report from
// inside its container and it reaches its status; before that, the job
// attacks the reader with a symbolic link to a file on the node that holds
// a valid report, and the agent refuses it (its log says why) and never
// publishes it.
func TestGoodputReportE2E(t *testing.T) {
	needBinary(t)
	rt := privateContainerd(t, "h6-goodput-e2e")
	env := newDevEnv(t)
	planted := filepath.Join(t.TempDir(), "node-secret.json")
	if err := os.WriteFile(planted, []byte(`{"size":8,"samplesPerSecond":777}`), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := append(env.environ(),
		"VOYAGER_AGENT_NODE=h6-goodput", "VOYAGER_AGENT_CONTAINERD="+rt.Address(), "VOYAGER_AGENT_NAMESPACE="+rt.Namespace(),
		"VOYAGER_AGENT_IMAGE="+agentTestImage, "VOYAGER_AGENT_STOP_GRACE=2s", "VOYAGER_AGENT_SIMULATE_GPUS=8xA100-80GB",
		"VOYAGER_AGENT_ACTIVITY_EVERY=1s", "VOYAGER_AGENT_PORTS=26100-26199")
	dev := start(t, environ, "dev")
	dev.waitFor(`msg="node registered"`, 60*time.Second)
	token := binaryToken(t, environ, "-sub", "ada")

	// Every value the job's status takes.
	cli := etcdClient(t, env.clientAddr)
	k := state.MustKeys(state.DefaultPrefix)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var values []string
	wch := cli.Watch(ctx, k.Status(""), clientv3.WithPrefix())
	go func() {
		for r := range wch {
			mu.Lock()
			for _, ev := range r.Events {
				values = append(values, string(ev.Kv.Value))
			}
			mu.Unlock()
		}
	}()

	code, out, errOut := runBinaryAs(t, environ, env.httpAddr, token, "session", "create", "--kind", "batch", "--cpu", "0.2", "--memory", "256",
		"-o", "name", "--gpus", "2-8", "--env", "PLANTED="+planted, "--", "sh", "-c", goodputStandIn)
	if code != 0 {
		t.Fatalf("session create: exit %d\n%s%s", code, out, errOut)
	}
	id := strings.TrimSpace(out)
	logFile := filepath.Join(env.dataDir(), "homes", "ada", "goodput.log")
	waitLog := func(what string) {
		t.Helper()
		deadline := time.Now().Add(120 * time.Second)
		for {
			b, _ := os.ReadFile(logFile)
			if strings.Contains(string(b), what) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the job never logged %q; its log: %q", what, b)
			}
			time.Sleep(250 * time.Millisecond) // polling a file for a condition, with a deadline
		}
	}
	waitLog("planted " + planted)
	// The agent read the link and refused it.
	dev.waitFor("not a regular file", 60*time.Second)
	waitStatus := func(what string, cond func(state.Status) bool) state.Status {
		t.Helper()
		deadline := time.Now().Add(120 * time.Second)
		for {
			st, _, err := state.Get[state.Status](ctx, cli, k.Status(id))
			if err != nil {
				t.Fatal(err)
			}
			if cond(st) {
				return st
			}
			if time.Now().After(deadline) {
				b, _ := json.Marshal(st)
				t.Fatalf("waited for %s; the status: %s", what, b)
			}
			time.Sleep(250 * time.Millisecond) // polling etcd for a condition, with a deadline
		}
	}
	waitStatus("the refusal in the status", func(st state.Status) bool {
		return st.Activity != nil && strings.Contains(st.Activity.GoodputError, "not a regular file")
	})
	if err := os.WriteFile(filepath.Join(env.dataDir(), "homes", "ada", "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitLog("written")

	st := waitStatus("the report in the status", func(st state.Status) bool {
		return st.Elastic != nil && len(st.Elastic.Goodput) > 0 && st.Activity != nil && st.Activity.Goodput != nil && st.Activity.GoodputError == ""
	})
	g := st.Elastic.Goodput[0]
	if len(st.Elastic.Goodput) != 1 || g.Size != st.Elastic.Size || g.Size != 8 || g.SamplesPerSecond != 1234.5 || g.Efficiency != 0.9 {
		t.Errorf("status.elastic.goodput %+v at size %d, want the job's report at 8 GPUs", st.Elastic.Goodput, st.Elastic.Size)
	}
	mu.Lock()
	for _, v := range values {
		if strings.Contains(v, `"samplesPerSecond":777`) { // the planted report's figure (not a timestamp's digits)
			t.Errorf("the node's file behind the link was published: %s", v)
		}
	}
	mu.Unlock()

	runBinaryAs(t, environ, env.httpAddr, token, "session", "stop", id)
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}
