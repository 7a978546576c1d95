package sweep_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/sweep"
)

// TestElementSecretsStayOutOfSpecs: an array's template environment
// values live in specsecrets/<array>, not in arrays/<id>; each element's
// spec holds the names with empty values and its own secrets record holds
// the values with {index} replaced.
func TestElementSecretsStayOutOfSpecs(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys(state.DefaultPrefix)
	ctx := context.Background()
	a := state.Array{ID: "swsec", Owner: "ada", Indices: "0-2", MaxRunning: 3, Created: time.Now().UTC(),
		Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}, Desired: state.DesiredRunning,
			Env: map[string]string{"API_KEY": "sk-secret", "RUN": "run-{index}"}}}
	if err := state.CreateArray(ctx, cli, k, a); err != nil {
		t.Fatal(err)
	}
	rec, err := cli.Get(ctx, k.Array(a.ID))
	if err != nil || len(rec.Kvs) != 1 || strings.Contains(string(rec.Kvs[0].Value), "sk-secret") {
		t.Fatalf("arrays/%s holds the secret: %s %v", a.ID, rec.Kvs, err)
	}
	if err := sweep.New(cli, sweep.Config{Keys: k, Logger: quiet()}).Reconcile(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	for i, idx := range []string{"0", "1", "2"} {
		id := state.ElementID(a.ID, i)
		s, _, err := state.Get[state.Session](ctx, cli, k.Session(id))
		if err != nil {
			t.Fatal(err)
		}
		if !s.SecretEnv || s.Env["API_KEY"] != "" || s.Env["RUN"] != "" || s.Env[state.EnvArrayIndex] != idx {
			t.Errorf("element %s spec env %v secretEnv %v; want values held out, VOYAGER_* kept", id, s.Env, s.SecretEnv)
		}
		sec, _, err := state.Get[state.SpecSecrets](ctx, cli, k.SpecSecrets(id))
		if err != nil || sec.Env["API_KEY"] != "sk-secret" || sec.Env["RUN"] != "run-"+idx {
			t.Errorf("element %s secrets %+v %v", id, sec, err)
		}
		if q, _, err := state.Get[state.QueueEntry](ctx, cli, k.Pending(id)); err != nil || !q.Secrets {
			t.Errorf("element %s queue entry %+v %v; want secrets: true", id, q, err)
		}
	}
}
