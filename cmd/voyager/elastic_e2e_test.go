package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/state"
)

// elasticStandIn is a stand-in training script: it records, in its home
// (the owner's persistent home volume, the same across restarts), each
// start with the world it sees (VOYAGER_GPUS, WORLD_SIZE, the ranks, the
// GPU devices in the container) and the checkpoint it resumes from, and
// each SIGTERM, on which it writes its checkpoint in the grace and exits.
const elasticStandIn = `log=$HOME/elastic.log; ck=$HOME/elastic.ckpt
trap 'echo "TERM gpus=$VOYAGER_GPUS world=$WORLD_SIZE" >> $log; echo "$VOYAGER_GPUS" > $ck; exit 0' TERM
devs=$(ls /dev/ | grep -c '^nvidia[0-9]')
echo "START gpus=$VOYAGER_GPUS world=$WORLD_SIZE nproc=$NPROC_PER_NODE nnodes=$NNODES rank=$NODE_RANK devices=$devs resizes=$VOYAGER_RESIZES from=$(cat $ck 2>/dev/null || echo none)" >> $log
while :; do sleep 1 & wait $!; done`

// TestElasticJobE2E is an elastic job end to end on `voyager dev` with its
// real agent on a real containerd, over a SIMULATED node of 8 GPUs: ada's
// job of 2-8 GPUs starts at 2 while bob's three fixed jobs hold the other
// 6; grows to 8 when they end; shrinks back to 2 when carol's fixed
// 6-GPU job waits (carol holds less than ada: fair share owes her the
// GPUs). Each resize is a restart: the stand-in sees SIGTERM and writes
// its checkpoint in the grace, then starts again with the new WORLD_SIZE,
// VOYAGER_GPUS and as many GPU devices, resuming from the checkpoint on
// the same home volume. The status and the resize count say what
// happened; the usage accountant counts each size's GPU-time; the history
// checker finds no revision where the job held more than its size.
func TestElasticJobE2E(t *testing.T) {
	needBinary(t)
	rt := privateContainerd(t, "h7-elastic-e2e")
	env := newDevEnv(t)
	environ := append(env.environ(),
		"VOYAGER_AGENT_NODE=h7-elastic", "VOYAGER_AGENT_CONTAINERD="+rt.Address(), "VOYAGER_AGENT_NAMESPACE="+rt.Namespace(),
		"VOYAGER_AGENT_IMAGE="+agentTestImage, "VOYAGER_AGENT_STOP_GRACE=5s", "VOYAGER_AGENT_SIMULATE_GPUS=8xA100-80GB",
		"VOYAGER_ELASTIC_RESIZE_INTERVAL=3s", "VOYAGER_AGENT_PORTS=27100-27199")
	dev := start(t, environ, "dev")
	dev.waitFor(`msg="node registered"`, 60*time.Second)
	tokens := map[string]string{}
	for _, u := range []string{"ada", "bob", "carol"} {
		tokens[u] = binaryToken(t, environ, "-sub", u)
	}
	create := func(user string, args ...string) string {
		t.Helper()
		return createBatchAs(t, environ, env.httpAddr, tokens[user], args...)
	}
	status := func(user, id string) state.Status {
		t.Helper()
		return statusAs(t, environ, env.httpAddr, tokens[user], id)
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(120 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(250 * time.Millisecond) // polling the API and a file for a condition, with a deadline
		}
	}
	logFile := filepath.Join(env.dataDir(), "homes", "ada", "elastic.log")
	records := func() []string {
		b, _ := os.ReadFile(logFile)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	has := func(re string) func() bool {
		r := regexp.MustCompile(re)
		return func() bool {
			for _, l := range records() {
				if r.MatchString(l) {
					return true
				}
			}
			return false
		}
	}

	// bob holds 6 of the 8 GPUs.
	var bobs []string
	for i := 0; i < 3; i++ {
		bobs = append(bobs, create("bob", "--gpus", "2", "--", "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"))
	}
	for _, id := range bobs {
		waitUntil(id+" running", func() bool { return status("bob", id).Phase == state.PhaseRunning })
	}

	// ada's elastic job starts at the 2 that are free.
	ada := create("ada", "--gpus", "2-8", "--", "sh", "-c", elasticStandIn)
	waitUntil(ada+" started at 2 GPUs", has(`^START gpus=2 world=2 nproc=2 nnodes=1 rank=0 devices=2 resizes=0 from=none$`))
	st := status("ada", ada)
	if st.Elastic == nil || st.Elastic.Size != 2 || st.Elastic.Min != 2 || st.Elastic.Max != 8 {
		t.Fatalf("%s's status at the start: elastic %+v", ada, st.Elastic)
	}

	// bob's jobs end: it grows to 8, through checkpointing restarts (one,
	// or more where bob's jobs are released a few seconds apart and it
	// grows into each as it goes idle, one resize per interval).
	if code, _, errOut := runBinaryAs(t, environ, env.httpAddr, tokens["bob"], append([]string{"session", "stop"}, bobs...)...); code != 0 {
		t.Fatalf("stop %v: %s", bobs, errOut)
	}
	waitUntil(ada+" restarted at 8 GPUs", has(`^START gpus=8 world=8 nproc=8 nnodes=1 rank=0 devices=8 resizes=[1-9] from=[2-7]$`))
	waitUntil(ada+"'s status at 8", func() bool { st := status("ada", ada); return st.Elastic != nil && st.Elastic.Size == 8 })
	grown := len(records())

	// carol's fixed job of 6 waits: ada shrinks back to 2, and carol runs.
	carol := create("carol", "--gpus", "6", "--", "sh", "-c", "sleep 600")
	waitUntil(ada+" restarted at 2 GPUs", has(`^START gpus=2 world=2 nproc=2 nnodes=1 rank=0 devices=2 resizes=[1-9] from=8$`))
	waitUntil(carol+" running", func() bool { return status("carol", carol).Phase == state.PhaseRunning })

	// The records alternate START and TERM: each start sees the world of
	// its size (WORLD_SIZE, VOYAGER_GPUS, as many devices), counts the
	// resizes before it and resumes from the checkpoint its predecessor
	// wrote on SIGTERM at the size it ran at; the sizes only grow up to 8,
	// then one shrink takes it to 2.
	startRE := regexp.MustCompile(`^START gpus=(\d+) world=(\d+) nproc=(\d+) nnodes=1 rank=0 devices=(\d+) resizes=(\d+) from=(\w+)$`)
	termRE := regexp.MustCompile(`^TERM gpus=(\d+) world=(\d+)$`)
	got := records()
	if len(got)%2 != 1 || len(got) != grown+2 {
		t.Fatalf("the stand-in recorded %d lines (%d when at 8), want START, TERM, … START, and one TERM and START for the shrink:\n%s", len(got), grown, strings.Join(got, "\n"))
	}
	var sizes []int
	for i, l := range got {
		if i%2 == 1 {
			m := termRE.FindStringSubmatch(l)
			if m == nil || m[1] != m[2] || atoi(t, m[1]) != sizes[len(sizes)-1] {
				t.Errorf("record %d %q: want the SIGTERM of the run at %d GPUs", i, l, sizes[len(sizes)-1])
			}
			continue
		}
		m := startRE.FindStringSubmatch(l)
		if m == nil || m[1] != m[2] || m[1] != m[3] || m[1] != m[4] || atoi(t, m[5]) != i/2 {
			t.Errorf("record %d %q: want a start whose world, processes and devices are its GPUs, after %d resizes", i, l, i/2)
			continue
		}
		if i > 0 && m[6] != strconv.Itoa(sizes[len(sizes)-1]) {
			t.Errorf("record %d %q: want it to resume from the checkpoint of the run at %d GPUs", i, l, sizes[len(sizes)-1])
		}
		sizes = append(sizes, atoi(t, m[1]))
	}
	for i := 1; i < len(sizes)-1; i++ {
		if sizes[i] <= sizes[i-1] {
			t.Errorf("sizes %v: want them to grow up to 8, then one shrink", sizes)
		}
	}
	if sizes[0] != 2 || sizes[len(sizes)-2] != 8 || sizes[len(sizes)-1] != 2 {
		t.Errorf("sizes %v: want 2, growing to 8, then 2", sizes)
	}
	st = status("ada", ada)
	if st.Elastic == nil || st.Elastic.Size != 2 || st.Elastic.Resizes != len(sizes)-1 || !strings.Contains(st.Elastic.Why, carol) || st.Phase != state.PhaseRunning {
		t.Errorf("%s's status after the shrink: phase %s, elastic %+v", ada, st.Phase, st.Elastic)
	}

	// Accounting: each size's attempt is its own accrual, at its size.
	cli := etcdClient(t, env.clientAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k := state.MustKeys(state.DefaultPrefix)
	accrued := func() []int {
		r, err := cli.Get(ctx, k.Accruals()+ada+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, kv := range r.Kvs {
			a, err := state.Decode[state.Accrual](kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			if a.GPUMilliseconds != state.GPUMillis(a.GPUs, a.Bound, a.Ended) {
				t.Errorf("accrual %s: %d GPU-ms for %d GPUs", kv.Key, a.GPUMilliseconds, a.GPUs)
			}
			out = append(out, a.GPUs)
		}
		return out
	}
	ended := sizes[:len(sizes)-1]
	waitUntil("every ended size accounted", func() bool { return len(accrued()) == len(ended) })
	if a := accrued(); !slices.Equal(a, ended) {
		t.Errorf("accrued sizes %v, want those the job ran at and ended, %v", a, ended)
	}

	// The whole history: no revision where the job held more than its
	// size, and every other rule holds.
	r, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	res, err := history.Watch(ctx, cli, k, history.Options{Start: 1, End: r.Header.Revision})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Violations {
		t.Errorf("history: %s", v)
	}

	for _, id := range []string{ada, carol} {
		user := "ada"
		if id == carol {
			user = "carol"
		}
		runBinaryAs(t, environ, env.httpAddr, tokens[user], "session", "stop", id)
	}
	waitUntil("both stopped", func() bool { return status("ada", ada).Phase.Terminal() && status("carol", carol).Phase.Terminal() })
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// TestRunSummaryOfAnElasticJob: the summary of an elastic job counts its
// last attempt at the size it was bound at (as a restarted job's counts its
// last attempt), not its minimum.
func TestRunSummaryOfAnElasticJob(t *testing.T) {
	start := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	end := start.Add(time.Hour)
	spec := state.Session{ID: "s", Resources: state.Resources{GPUs: 2}, Elastic: &state.Elastic{Min: 2, Max: 8}}
	st := state.Status{Phase: state.PhaseSucceeded, Nodes: []string{"n1"}, Started: &start, Finished: &end,
		Elastic: &state.Elastic{Min: 2, Max: 8, Size: 6, Resizes: 1}}
	if sum := summarize(spec, st); sum.GPUs != 6 || sum.GPUHours != 6 {
		t.Fatalf("summary %+v; want 6 GPUs for an hour", sum)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}
