package testreq

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// Env names the variable that turns skips into failures: "all" for every
// component, or a comma-separated list of component names (for example
// "containerd,etcdctl"). Empty or unset: missing components skip.
const Env = "VOYAGER_TEST_REQUIRE"

// Required reports whether the component must be present, by Env.
func Required(component string) bool {
	for _, c := range strings.Split(os.Getenv(Env), ",") {
		c = strings.TrimSpace(c)
		if c == "all" || strings.EqualFold(c, component) {
			return true
		}
	}
	return false
}

// Missing stops tb because component is not available, saying why and how
// to get it: a skip, or a failure when Required(component). It never
// returns.
func Missing(tb testing.TB, component, why string) {
	tb.Helper()
	if !slices.Contains(Components, component) {
		tb.Fatalf("testreq: unknown component %q; use one of %v (or add it to testreq.Components)", component, Components)
	}
	if Required(component) {
		tb.Fatalf("%s is required (%s=%s) but missing: %s", component, Env, os.Getenv(Env), why)
	}
	tb.Skipf("%s missing: %s (set %s=all to make this a failure)", component, why, Env)
}

// Components lists the component names the repository's tests pass to
// Missing, for documentation and for a list given to Env.
var Components = []string{"root", "containerd", "runc", "busybox-static", "etcd-server", "etcdctl",
	"jupyterhub", "python3-jwt", "debootstrap", "cni-plugins", "chromium", "zsh", "bash-completion"}
