package main

import (
	"fmt"
	"net"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

// controlPlaneProbePort is where checkControlPlaneUnreachable's control
// listener answers: a port of no control-plane process, which sessions
// may reach.
const controlPlaneProbePort = 24611

// checkControlPlaneUnreachable runs a job through env (default agent
// settings) that tries to open a TCP connection to every control-plane
// endpoint of the machines: each etcd member's client and peer port, each
// API, each placer's HTTP port and each GPU machine's agent. None may
// open. A listener of no control-plane process on a control machine
// (open) shows that the probe sees an open port when there is one.
func checkControlPlaneUnreachable(t *testing.T, env []string, ns string, targets []string, open string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(open)
	ctl := exec.Command("nsenter", "--net=/run/netns/"+ns, "--", "/bin/busybox", "nc", "-ll", "-p", port, "-e", "/bin/true")
	if err := ctl.Start(); err != nil {
		t.Fatalf("start the control listener: %v", err)
	}
	t.Cleanup(func() { _ = ctl.Process.Kill(); _ = ctl.Wait() })
	var b strings.Builder
	b.WriteString(`printf '#!/bin/sh\necho "OPEN $T" >&2\n' > $HOME/o; chmod +x $HOME/o; `)
	for _, tg := range append(append([]string{}, targets...), open) {
		h, p, _ := net.SplitHostPort(tg)
		fmt.Fprintf(&b, "T=%s nc -w 2 %s %s -e $HOME/o; ", tg, h, p)
	}
	b.WriteString("echo PROBES-DONE")
	deadline := time.Now().Add(30 * time.Second)
	var code int
	var out string
	for {
		code, out = runVoyager(t, env, "run", "--", "sh", "-c", b.String())
		// The control listener may not listen yet on the first try.
		if code != 0 || strings.Contains(out, "OPEN "+open) || time.Now().After(deadline) {
			break
		}
	}
	if code != 0 || !strings.Contains(out, "PROBES-DONE") {
		t.Fatalf("probe job: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "OPEN "+open) {
		t.Fatalf("the probe did not see the control listener %s open: it cannot tell open from shut\n%s", open, out)
	}
	var reached []string
	for _, tg := range targets {
		if strings.Contains(out, "OPEN "+tg) {
			reached = append(reached, tg)
		}
	}
	sort.Strings(reached)
	if len(reached) > 0 {
		t.Errorf("a session with default settings reached control-plane endpoints %v", reached)
		return
	}
	t.Logf("a session reached none of %d control-plane endpoints (etcd client and peer ports, APIs, placers, agents); the control listener %s was open to it", len(targets), open)
}
