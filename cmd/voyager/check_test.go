package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestCheckCommand runs `voyager check` against a real etcd: a clean range
// exits 0; a range with a binding that has no allocation exits 1 and
// prints its revision, key and rule; a compacted start is an error.
func TestCheckCommand(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	t.Setenv(config.EnvEtcdEndpoints, c.Server.Endpoint())
	t.Setenv(config.EnvEtcdPrefix, "/checked")
	k := state.MustKeys("/checked")
	r, err := cli.Put(ctx, k.Node("n1"), `{"name":"n1","cpuMilli":1000,"memoryMiB":1024,"gpus":[],"ports":{"first":1,"last":2}}`)
	if err != nil {
		t.Fatal(err)
	}
	start := r.Header.Revision
	check := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"check"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	if code, out, errOut := check("--start", fmt.Sprint(start)); code != exitOK || out != "" {
		t.Fatalf("clean history: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	bad, err := cli.Put(ctx, k.Binding("n1", "s1"), `{"session":"s1","node":"n1"}`)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := check("--start", fmt.Sprint(start))
	want := fmt.Sprintf("revision %d key %s rule binding-without-allocation", bad.Header.Revision, k.Binding("n1", "s1"))
	if code != exitError || !strings.HasPrefix(out, want) || !strings.Contains(errOut, "1 violations") {
		t.Errorf("broken history: exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, want)
	}
	if _, err := cli.Compact(ctx, bad.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := check("--start", fmt.Sprint(start)); code != exitError || !strings.Contains(errOut, "compacted") {
		t.Errorf("compacted start: exit %d, stderr %q; want exit 1 saying compacted", code, errOut)
	}
	if code, _, errOut := check("--end", "5", "--follow"); code != exitUsage {
		t.Errorf("-end with -follow: exit %d, stderr %q; want %d", code, errOut, exitUsage)
	}
}
