package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// elasticNodesStandIn is a stand-in multi-node training script: every
// part records, in the owner's home (one directory all three agents
// mount, as a shared file system would be), each start with the world it
// sees (WORLD_SIZE, NNODES, its NODE_RANK, rank 0's MASTER_ADDR and
// MASTER_PORT, the hostfile's machines, its GPU devices, the resizes
// before it) and each SIGTERM, on which it exits in its grace.
const elasticNodesStandIn = `log=$HOME/enodes.log
trap 'echo "TERM rank=$NODE_RANK world=$WORLD_SIZE" >> $log; exit 0' TERM
devs=$(ls /dev/ | grep -c '^nvidia[0-9]')
echo "START rank=$NODE_RANK world=$WORLD_SIZE nnodes=$NNODES master=$MASTER_ADDR:$MASTER_PORT hosts=$(wc -l < $VOYAGER_HOSTFILE) devices=$devs resizes=$VOYAGER_RESIZES range=$VOYAGER_ELASTIC_MIN_NODES-$VOYAGER_ELASTIC_MAX_NODES" >> $log
while :; do sleep 1 & wait $!; done`

// TestElasticNodesE2E is an elastic multi-node job end to end: `voyager
// dev` and two more agents (three SIMULATED machines of 2 GPUs, each
// agent its own containerd namespace of one real containerd, all sharing
// dev's etcd). ada's job of 1-3 machines of 2 GPUs starts on 1 while bob's
// two fixed jobs hold the other two; grows to 3 when they end; shrinks to
// 2 when carol's fixed 2-GPU job waits (carol holds less than ada: fair
// share owes her a machine). Each resize is a restart of every part: the
// stand-in records each start's WORLD_SIZE, NNODES, NODE_RANK and
// MASTER_ADDR and each SIGTERM. The statuses say the count and why; the
// accountant counts each count's GPU-time; the history checker finds no
// revision where the job held more machines or GPUs than its count.
func TestElasticNodesE2E(t *testing.T) {
	needBinary(t)
	nodes := []string{"h5-enodes-0", "h5-enodes-1", "h5-enodes-2"}
	rt := privateContainerd(t, nodes[0])
	env := newDevEnv(t)
	homes := filepath.Join(env.dataDir(), "homes")
	environ := append(env.environ(),
		"VOYAGER_AGENT_NODE="+nodes[0], "VOYAGER_AGENT_CONTAINERD="+rt.Address(), "VOYAGER_AGENT_NAMESPACE="+rt.Namespace(),
		"VOYAGER_AGENT_IMAGE="+agentTestImage, "VOYAGER_AGENT_STOP_GRACE=5s", "VOYAGER_AGENT_SIMULATE_GPUS=2xA100-80GB",
		"VOYAGER_ELASTIC_RESIZE_INTERVAL=3s", "VOYAGER_AGENT_PORTS=25000-25099", "VOYAGER_AGENT_HOME_DIR="+homes)
	dev := start(t, environ, "dev")
	dev.waitFor(`msg="node registered"`, 60*time.Second)
	for i, n := range nodes[1:] {
		ns := namespaceRuntime(t, rt.Address(), n)
		home := t.TempDir()
		a := start(t, append(localAgentEnv(t, home, n, rt.Address(), ns.Namespace(), agentTimings{keeper: testFenceKeeper()}),
			"HOME="+home, "VOYAGER_ETCD_ENDPOINTS=http://"+env.clientAddr, "VOYAGER_HTTP_ADDR="+etcdtest.FreeAddr(t),
			"VOYAGER_AGENT_STOP_GRACE=5s", "VOYAGER_AGENT_HOME_DIR="+homes, "VOYAGER_LOG_LEVEL=debug",
			fmt.Sprintf("VOYAGER_AGENT_PORTS=%d-%d", 25100+100*i, 25199+100*i)), "agent")
		a.waitFor(`msg="node registered"`, 60*time.Second)
		t.Cleanup(func() { a.stop() })
	}
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
		deadline := time.Now().Add(180 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(filepath.Join(homes, "ada", "enodes.log"))
				t.Fatalf("timed out waiting for %s; the stand-in recorded:\n%s", what, b)
			}
			time.Sleep(250 * time.Millisecond) // polling the API and a file for a condition, with a deadline
		}
	}
	logFile := filepath.Join(homes, "ada", "enodes.log")
	records := func() []string {
		b, _ := os.ReadFile(logFile)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	startRE := regexp.MustCompile(`^START rank=(\d+) world=(\d+) nnodes=(\d+) master=(\S+):(\d+) hosts=(\d+) devices=(\d+) resizes=(\d+) range=1-3$`)
	// started reports whether every rank of a world of n has recorded a
	// start after the first from records.
	started := func(n, from int) func() bool {
		return func() bool {
			ranks := map[string]bool{}
			for _, l := range records()[min(from, len(records())):] {
				if m := startRE.FindStringSubmatch(l); m != nil && m[2] == fmt.Sprint(n) {
					ranks[m[1]] = true
				}
			}
			return len(ranks) == n
		}
	}

	// bob holds two of the three machines.
	var bobs []string
	for i := 0; i < 2; i++ {
		bobs = append(bobs, create("bob", "--gpus", "2", "--", "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"))
	}
	for _, id := range bobs {
		waitUntil(id+" running", func() bool { return status("bob", id).Phase == state.PhaseRunning })
	}

	// ada's elastic job starts on the one machine that is free.
	ada := create("ada", "--gpus", "2", "--nodes", "1-3", "--", "sh", "-c", elasticNodesStandIn)
	waitUntil(ada+" started on 1 machine", started(1, 0))
	waitUntil(ada+" running on 1", func() bool { return status("ada", ada).Phase == state.PhaseRunning })
	st := status("ada", ada)
	if el := st.Elastic; el == nil || el.Nodes != 1 || el.Size != 2 || el.MinNodes != 1 || el.MaxNodes != 3 || len(st.Nodes) != 1 {
		t.Fatalf("%s's status at the start: nodes %v, elastic %+v", ada, st.Nodes, st.Elastic)
	}

	// bob's jobs end: it grows to 3 machines (in one resize, or two
	// where bob's are released a few seconds apart), each a restart.
	if code, _, errOut := runBinaryAs(t, environ, env.httpAddr, tokens["bob"], append([]string{"session", "stop"}, bobs...)...); code != 0 {
		t.Fatalf("stop %v: %s", bobs, errOut)
	}
	waitUntil(ada+" restarted on 3 machines", started(3, 0))
	waitUntil(ada+"'s status on 3", func() bool {
		st := status("ada", ada)
		return st.Phase == state.PhaseRunning && st.Elastic != nil && st.Elastic.Nodes == 3 && len(st.Nodes) == 3
	})
	grown := len(records())

	// carol's fixed job of one machine waits: ada shrinks to 2, and carol runs.
	carol := create("carol", "--gpus", "2", "--", "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done")
	waitUntil(ada+" restarted on 2 machines", started(2, grown))
	waitUntil(carol+" running", func() bool { return status("carol", carol).Phase == state.PhaseRunning })
	waitUntil(ada+"'s status on 2", func() bool {
		st := status("ada", ada)
		return st.Phase == state.PhaseRunning && st.Elastic != nil && st.Elastic.Nodes == 2
	})
	st = status("ada", ada)
	if el := st.Elastic; el.Size != 4 || len(st.Nodes) != 2 || slices.Contains(st.Nodes, status("carol", carol).Nodes[0]) || !strings.Contains(el.Why, carol) || !strings.Contains(el.Why, "nodes") {
		t.Errorf("%s's status after the shrink: nodes %v (carol on %v), elastic %+v", ada, st.Nodes, status("carol", carol).Nodes, st.Elastic)
	}

	// The records: the starts of each attempt (its world) one per rank,
	// each seeing its world's size and rank, rank 0's address, a hostfile
	// of its world's machines and its own 2 GPUs; every part of an attempt
	// but the last got SIGTERM before the next began.
	type attempt struct {
		world   int
		ranks   []int
		resizes string
	}
	var attempts []*attempt
	terms := map[int]int{} // world → SIGTERMs
	termRE := regexp.MustCompile(`^TERM rank=(\d+) world=(\d+)$`)
	for _, l := range records() {
		if m := termRE.FindStringSubmatch(l); m != nil {
			terms[atoi(t, m[2])]++
			continue
		}
		m := startRE.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("record %q: want a START or a TERM", l)
			continue
		}
		world, rank := atoi(t, m[2]), atoi(t, m[1])
		if m[3] != m[2] || m[6] != m[2] || m[7] != "2" || rank >= world || m[4] == "" || m[5] == "0" {
			t.Errorf("record %q: want NNODES and the hostfile's machines equal to WORLD_SIZE, a rank below it, MASTER_ADDR:MASTER_PORT and 2 GPUs", l)
		}
		if n := len(attempts); n == 0 || attempts[n-1].world != world || slices.Contains(attempts[n-1].ranks, rank) {
			attempts = append(attempts, &attempt{world: world, resizes: m[8]})
		}
		a := attempts[len(attempts)-1]
		if a.resizes != m[8] {
			t.Errorf("record %q: the parts of one attempt disagree on VOYAGER_RESIZES (%s)", l, a.resizes)
		}
		a.ranks = append(a.ranks, rank)
	}
	var worlds []int
	for i, a := range attempts {
		sort.Ints(a.ranks)
		if want := seq(a.world); !slices.Equal(a.ranks, want) {
			t.Errorf("attempt %d on %d machines: ranks %v started, want %v", i, a.world, a.ranks, want)
		}
		if a.resizes != fmt.Sprint(i) {
			t.Errorf("attempt %d: VOYAGER_RESIZES %s, want %d", i, a.resizes, i)
		}
		worlds = append(worlds, a.world)
	}
	if len(worlds) < 3 || worlds[0] != 1 || worlds[len(worlds)-2] != 3 || worlds[len(worlds)-1] != 2 {
		t.Errorf("worlds %v: want 1, growing to 3, then 2", worlds)
	}
	for i := 1; i < len(worlds)-1; i++ {
		if worlds[i] <= worlds[i-1] {
			t.Errorf("worlds %v: want them to grow up to 3, then one shrink", worlds)
		}
	}
	for _, w := range worlds[:len(worlds)-1] {
		if terms[w] < w {
			t.Errorf("the attempt on %d machines: %d SIGTERMs recorded, want one per part (records %v)", w, terms[w], records())
		}
	}
	if st := status("ada", ada); st.Elastic.Resizes != len(worlds)-1 {
		t.Errorf("status says %d resizes, the stand-in saw %d attempts", st.Elastic.Resizes, len(worlds))
	}

	// Accounting: each count's attempt is its own accrual, at its GPUs.
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
			out = append(out, a.GPUs)
		}
		return out
	}
	var ended []int
	for _, w := range worlds[:len(worlds)-1] {
		ended = append(ended, 2*w)
	}
	waitUntil("every ended count accounted", func() bool { return len(accrued()) == len(ended) })
	if a := accrued(); !slices.Equal(a, ended) {
		t.Errorf("accrued GPUs %v, want those of each count the job ran on and ended, %v", a, ended)
	}

	// The whole history: no revision where the job held more machines or
	// GPUs than its count, and every other rule holds.
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
	t.Logf("ada's job ran on %v machines; %d history revisions checked", worlds, res.Last)

	runBinaryAs(t, environ, env.httpAddr, tokens["ada"], "session", "stop", ada)
	runBinaryAs(t, environ, env.httpAddr, tokens["carol"], "session", "stop", carol)
	waitUntil("both stopped", func() bool { return status("ada", ada).Phase.Terminal() && status("carol", carol).Phase.Terminal() })
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// seq is 0 to n-1.
func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
