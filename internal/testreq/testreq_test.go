package testreq

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how a test would have ended.
type recorder struct {
	testing.TB
	ended, msg string
}

// stopped is what the recorder panics with where testing would Goexit.
type stopped struct{}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.ended, r.msg = "failed", fmt.Sprintf(format, args...)
	panic(stopped{})
}
func (r *recorder) Skipf(format string, args ...any) {
	r.ended, r.msg = "skipped", fmt.Sprintf(format, args...)
	panic(stopped{})
}

// run calls Missing on a recorder and returns it, checking that Missing
// did not return.
func run(t *testing.T, component, why string) *recorder {
	t.Helper()
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil {
				if _, ok := p.(stopped); !ok {
					panic(p)
				}
			}
		}()
		Missing(r, component, why)
		r.ended = "returned"
	}()
	return r
}

// TestMissing: a missing component skips the test unless
// VOYAGER_TEST_REQUIRE names it or says "all", when it fails it; an unknown
// component name is a mistake in the test and fails.
func TestMissing(t *testing.T) {
	cases := []struct {
		name, env, component, want string
	}{
		{"unset skips", "", "containerd", "skipped"},
		{"all fails", "all", "containerd", "failed"},
		{"named fails", "etcdctl, containerd", "containerd", "failed"},
		{"named case-insensitively", "CONTAINERD", "containerd", "failed"},
		{"other named skips", "etcdctl", "containerd", "skipped"},
		{"unknown component fails", "", "containerdd", "failed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(Env, c.env)
			r := run(t, c.component, "apt-get install containerd")
			if r.ended != c.want {
				t.Fatalf("%s=%q, Missing(%q): %s (%q); want %s", Env, c.env, c.component, r.ended, r.msg, c.want)
			}
			if !strings.Contains(r.msg, c.component) {
				t.Errorf("message %q does not name the component", r.msg)
			}
			if c.component == "containerd" && !strings.Contains(r.msg, "apt-get install containerd") {
				t.Errorf("message %q does not say how to get it", r.msg)
			}
		})
	}
}

// TestMissingInARealRun runs this test binary again on a test that misses
// a component, as `go test` would: without the variable the run passes
// with the test skipped; with VOYAGER_TEST_REQUIRE=all it fails.
func TestMissingInARealRun(t *testing.T) {
	if os.Getenv("TESTREQ_CHILD") == "1" {
		return
	}
	for _, c := range []struct {
		env      string
		wantFail bool
		want     string
	}{
		{"", false, "--- SKIP: TestChildMissesAComponent"},
		{"all", true, "--- FAIL: TestChildMissesAComponent"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestChildMissesAComponent$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTREQ_CHILD=1", Env+"="+c.env)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != c.wantFail || !strings.Contains(string(out), c.want) {
			t.Errorf("%s=%q: exit %v, want failure %v and %q in:\n%s", Env, c.env, err, c.wantFail, c.want, out)
		}
	}
}

// TestChildMissesAComponent is the child of TestMissingInARealRun; it does
// nothing in a normal run.
func TestChildMissesAComponent(t *testing.T) {
	if os.Getenv("TESTREQ_CHILD") != "1" {
		return
	}
	Missing(t, "jupyterhub", "apt-get install jupyterhub")
	t.Error("Missing returned")
}
