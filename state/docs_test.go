package state_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// docExample is one "### `key` — Type" section of docs/state.md.
type docExample struct {
	key, typ, json string
}

var headingRE = regexp.MustCompile("^### `([^`]+)`.* — (\\w+)")

func readDocExamples(t *testing.T) ([]docExample, []string) {
	t.Helper()
	b, err := os.ReadFile("../docs/state.md")
	if err != nil {
		t.Fatalf("read docs/state.md: %v", err)
	}
	var (
		examples []docExample
		commands []string
		cur      *docExample
		inBlock  string
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case inBlock == "" && strings.HasPrefix(line, "```"):
			inBlock = strings.TrimPrefix(line, "```")
		case inBlock != "" && line == "```":
			inBlock = ""
		case inBlock == "json" && cur != nil:
			cur.json += line
		case inBlock == "sh":
			if strings.HasPrefix(line, "etcdctl ") {
				commands = append(commands, line)
			}
		case inBlock == "":
			if m := headingRE.FindStringSubmatch(line); m != nil {
				examples = append(examples, docExample{key: m[1], typ: m[2]})
				cur = &examples[len(examples)-1]
			}
		}
	}
	return examples, commands
}

// docTypes maps the type names used in docs/state.md to their Go types.
var docTypes = map[string]any{
	"Session":    state.Session{},
	"QueueEntry": state.QueueEntry{},
	"Status":     state.Status{},
	"Node":       state.Node{},
	"Ledger":     state.Ledger{},
	"Binding":    state.Binding{},
	"Cordon":     state.Cordon{},
	"Quota":      state.Quota{},
	"Profile":    state.Profile{},
	"Placer":     state.Placer{},
	"Warning":    state.Warning{},
	"Secrets":    state.Secrets{},
	"PartStatus": state.PartStatus{},
	"UsageMark":  state.UsageMark{},

	"IdempotencyRecord": state.IdempotencyRecord{},
	"UIDRecord":         state.UIDRecord{},
	"RayToken":          state.RayToken{},
	"SpecSecrets":       state.SpecSecrets{},
	"Endpoints":         state.Endpoints{},
	"Volume":            state.Volume{},
	"Team":              state.Team{},
	"Accrual":           state.Accrual{},
	"UsageDay":          state.UsageDay{},
	"UsageCursor":       state.UsageCursor{},
	"Array":             state.Array{},
	"Emptied":           state.Emptied{},
	"SubnetClaim":       state.SubnetClaim{},
	"RuntimeRecord":     state.RuntimeRecord{},
}

// strictDecode decodes s into a new value of typ's type, refusing unknown fields.
func strictDecode(typ any, s string) (any, error) {
	p := reflect.New(reflect.TypeOf(typ))
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(p.Interface()); err != nil {
		return nil, err
	}
	return p.Elem().Interface(), nil
}

// jsonFields returns the top-level JSON field names of struct type t.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// TestDocExamplesMatchTypes keeps docs/state.md and the Go types equal: every
// example decodes with no unknown field and names every field of its type.
func TestDocExamplesMatchTypes(t *testing.T) {
	examples, _ := readDocExamples(t)
	seen := map[string]bool{}
	for _, ex := range examples {
		t.Run(ex.typ, func(t *testing.T) {
			typ, ok := docTypes[ex.typ]
			if !ok {
				t.Fatalf("docs/state.md names type %q, which the test does not know", ex.typ)
			}
			seen[ex.typ] = true
			if ex.json == "" {
				t.Fatalf("section %s has no json example", ex.key)
			}
			if _, err := strictDecode(typ, ex.json); err != nil {
				t.Fatalf("example for %s does not decode into state.%s: %v", ex.key, ex.typ, err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal([]byte(ex.json), &m); err != nil {
				t.Fatal(err)
			}
			var got []string
			for k := range m {
				got = append(got, k)
			}
			sort.Strings(got)
			want := jsonFields(reflect.TypeOf(typ))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("example for %s shows fields %v; state.%s has %v", ex.key, got, ex.typ, want)
			}
		})
	}
	for name := range docTypes {
		if !seen[name] {
			t.Errorf("docs/state.md has no example for state.%s", name)
		}
	}
}

// TestEtcdctlReadsDocumentedKeys seeds a real etcd with the documented
// examples, written through this package, and runs every operator command of
// docs/state.md with Debian's etcdctl.
func TestEtcdctlReadsDocumentedKeys(t *testing.T) {
	etcdctl, err := exec.LookPath("etcdctl")
	if err != nil {
		t.Fatalf("etcdctl not found: install Debian's etcd-client (.ci/run does): %v", err)
	}
	examples, commands := readDocExamples(t)
	if len(commands) == 0 {
		t.Fatal("docs/state.md lists no etcdctl commands")
	}
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := state.MustKeys(state.DefaultPrefix)

	values := map[string]any{}
	for _, ex := range examples {
		v, err := strictDecode(docTypes[ex.typ], ex.json)
		if err != nil {
			t.Fatal(err)
		}
		values[ex.typ] = v
	}
	sess := values["Session"].(state.Session)
	if _, err := state.CreateSession(ctx, cli, k, sess, sess.Created); err != nil {
		t.Fatal(err)
	}
	node := values["Node"].(state.Node)
	binding := values["Binding"].(state.Binding)
	puts := map[string]any{
		k.Node(node.Name):                        node,
		k.Ledger(node.Name):                      values["Ledger"],
		k.Binding(binding.Node, binding.Session): binding,
		k.Cordon(node.Name):                      values["Cordon"],
		k.UserQuota("ada"):                       values["Quota"],
		k.GroupQuota("vision"):                   values["Quota"],
		k.Profile("a100-small"):                  values["Profile"],
		k.Volume("results"):                      values["Volume"],
		k.Team("vision"):                         values["Team"],
		k.Accrual(sess.ID, 1042):                 values["Accrual"],
		k.GPUHoursDir() + "2026-11-22":           values["UsageDay"],
		k.UsageCursor():                          values["UsageCursor"],
		k.Placer("placer-3f2a"):                  values["Placer"],
		k.Idempotency("ada", "9f2c"):             values["IdempotencyRecord"],
		k.Warning(sess.ID):                       values["Warning"],
		k.Part(binding.Node, sess.ID):            values["PartStatus"],
		k.Array("s01jq2k9a0c3m5t7vb2"):           values["Array"],
		k.Emptied("gpu-07"):                      values["Emptied"],
		k.Subnet("gpu-07"):                       values["SubnetClaim"],
		k.Runtimes("ada"):                        values["RuntimeRecord"],
	}
	for key, v := range puts {
		if _, err := state.Put(ctx, cli, key, v); err != nil {
			t.Fatal(err)
		}
	}
	// The type each directory's values must decode into.
	dirType := map[string]string{
		"sessions": "Session", "pending": "QueueEntry", "status": "Status",
		"nodes": "Node", "ledger": "Ledger", "bindings": "Binding",
		"cordons": "Cordon", "quotas": "Quota", "profiles": "Profile", "placers": "Placer",
		"idempotency": "IdempotencyRecord", "warnings": "Warning", "parts": "PartStatus", "volumes": "Volume", "arrays": "Array", "teams": "Team", "accruals": "Accrual", "gpuhours": "UsageDay", "emptied": "Emptied", "subnets": "SubnetClaim", "runtimes": "RuntimeRecord",
	}
	env := append(os.Environ(), "ETCDCTL_API=3", "ETCDCTL_ENDPOINTS="+c.Server.Endpoint())
	for _, command := range commands {
		args := strings.Fields(command)[1:]
		dir := strings.Split(strings.TrimPrefix(args[len(args)-1], "/voyager/"), "/")[0]
		t.Run(strings.Join(args, "_"), func(t *testing.T) {
			if args[0] == "watch" {
				checkWatch(t, ctx, etcdctl, env, args, func() {
					st := state.Status{Session: sess.ID, Phase: state.PhaseStopped, Updated: time.Now().UTC()}
					if _, err := state.Put(ctx, cli, k.Status(sess.ID), st); err != nil {
						t.Error(err)
					}
				})
				return
			}
			cmd := exec.CommandContext(ctx, etcdctl, args...)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", command, err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			switch {
			case contains(args, "--keys-only"):
				if len(lines) == 0 || !strings.HasPrefix(lines[0], k.All()+dir+"/") {
					t.Errorf("%s printed %q, want keys under %s", command, out, dir)
				}
			default:
				if len(lines)%2 != 0 || len(lines) == 0 {
					t.Fatalf("%s printed %d lines, want key/value pairs:\n%s", command, len(lines), out)
				}
				for i := 0; i < len(lines); i += 2 {
					if !strings.HasPrefix(lines[i], k.All()+dir+"/") {
						t.Errorf("line %d: key %q not under %s", i, lines[i], dir)
					}
					if _, err := strictDecode(docTypes[dirType[dir]], lines[i+1]); err != nil {
						t.Errorf("value of %s is not a %s as docs/state.md says: %v", lines[i], dirType[dir], err)
					}
				}
			}
		})
	}
}

// checkWatch starts `etcdctl watch`, performs change once the watch is
// established, and requires the change to be printed as documented.
func checkWatch(t *testing.T, ctx context.Context, etcdctl string, env, args []string, change func()) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	// --rev 1 replays history from the start, so the watch is certain to
	// report the change even if it is made before the stream is set up.
	cmd := exec.CommandContext(wctx, etcdctl, append(args, "--rev", "1")...)
	cmd.Env = env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	change()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		// PUT, key, value: the last event must be our Stopped status.
		if n := len(lines); n >= 3 && lines[n-3] == "PUT" && strings.Contains(lines[n-1], `"phase":"Stopped"`) {
			if _, err := strictDecode(state.Status{}, lines[n-1]); err != nil {
				t.Errorf("watched value is not a Status: %v", err)
			}
			return
		}
	}
	t.Fatalf("etcdctl watch ended without showing the change; it printed:\n%s", strings.Join(lines, "\n"))
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}
