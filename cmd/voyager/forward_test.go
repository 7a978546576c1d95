package main

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startForward runs `voyager session port-forward id spec` as u and
// returns the local address it forwards from.
func (u streamUser) startForward(id, spec string) string {
	u.t.Helper()
	c := exec.Command(binary, "session", "port-forward", id, spec)
	c.Env = append(u.environ, envURL+"=http://"+u.http, envToken+"="+u.token)
	stdout, err := c.StdoutPipe()
	if err != nil {
		u.t.Fatal(err)
	}
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		u.t.Fatal(err)
	}
	u.t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`^Forwarding from (127\.0\.0\.1:\d+) -> \d+\n$`).FindStringSubmatch(line)
	if err != nil || m == nil {
		u.t.Fatalf("port-forward printed %q (%v)\n%s", line, err, stderr.String())
	}
	return m[1]
}

// TestSessionPortForwardE2E: voyager session port-forward reaches a
// server that listens only on a session's own loopback (its network
// namespace), one connection after another, and nothing else: not another
// user (404), not a port where nothing listens in the session, and not
// the machine's own services (etcd, the API) although they listen on the
// machine's loopback at those numbers. On an agent whose sessions share
// the machine's network, where the container's loopback is the machine's,
// a port that is not the session's is refused (403). Every connection is
// in the audit log.
func TestSessionPortForwardE2E(t *testing.T) {
	needBinary(t)
	env, environ, dev := devWithAgent(t, "voyager-fwd-e2e", "fwd-e2e")
	ada := streamUser{t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "ada")}
	bob := streamUser{t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "bob")}
	id := ada.startSession("sh", "-c", "mkdir -p /tmp/www && echo hello-from-inside > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8000 -h /tmp/www")

	local := ada.startForward(id, ":8000")
	for i := range 3 {
		var body string
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + local + "/index.html")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %d through the forward: %v %q", i, err, body)
			}
			time.Sleep(200 * time.Millisecond) // httpd may still be starting
		}
		if strings.TrimSpace(body) != "hello-from-inside" {
			t.Errorf("GET %d through the forward = %q, want the session's page", i, body)
		}
	}

	path := "/api/v1/sessions/" + id + "/portforward"
	if code, out, stderr := bob.run("session", "port-forward", id, ":8000"); code != exitError || out != "" || !strings.Contains(stderr, "no session") {
		t.Errorf("bob's port-forward: exit %d, %q, %s; want 1 and no session", code, out, stderr)
	}
	if _, status, detail := dialAPI(t, env.httpAddr, bob.token, path, url.Values{"port": {"8000"}}); status != http.StatusNotFound {
		t.Errorf("bob's port-forward at the API: %d %s, want 404", status, detail)
	}
	_, etcdPort, _ := net.SplitHostPort(env.clientAddr)
	_, apiPort, _ := net.SplitHostPort(env.httpAddr)
	for _, p := range []string{"8001", etcdPort, apiPort} {
		if _, status, detail := dialAPI(t, env.httpAddr, ada.token, path, url.Values{"port": {p}}); status != http.StatusBadGateway || !strings.Contains(detail, "nothing in the session answers on port "+p) {
			t.Errorf("forward to port %s, outside what the session serves: %d %s; want 502, nothing answers", p, status, detail)
		}
	}
	if _, status, _ := dialAPI(t, env.httpAddr, ada.token, path, url.Values{"port": {"70000"}}); status != http.StatusUnprocessableEntity {
		t.Errorf("forward to port 70000: %d, want 422", status)
	}
	var forwards int
	for _, r := range auditRecords(t, env) {
		if r.Action == "port-forward" && r.Event == "start" && r.Port == 8000 && r.Subject == "ada" {
			forwards++
		}
	}
	if forwards < 3 {
		t.Errorf("audit log has %d port-forward starts to 8000, want one per connection (3 at least)", forwards)
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}

	t.Run("host network", func(t *testing.T) {
		env, environ, dev := devWithAgent(t, "voyager-fwd-host", "fwd-host", "VOYAGER_AGENT_NETWORK=host")
		ada := streamUser{t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "ada")}
		id := ada.startSession("sleep", "600")
		_, etcdPort, _ := net.SplitHostPort(env.clientAddr)
		_, status, detail := dialAPI(t, env.httpAddr, ada.token, "/api/v1/sessions/"+id+"/portforward", url.Values{"port": {etcdPort}})
		if status != http.StatusForbidden || !strings.Contains(detail, "not the session's") {
			t.Errorf("forward to etcd's port on a host-network node: %d %s; want 403, not the session's", status, detail)
		}
		if code := dev.stop(); code != 0 {
			t.Errorf("dev exit code %d", code)
		}
	})
}

// TestSSHProxyCommandE2E: OpenSSH's own client reaches a session's sshd
// with voyager ssh as its ProxyCommand, as docs/ssh.md says to: a session
// of the recipe image (deploy/images/sshd, Debian's openssh-server run as
// the session's user on its loopback) with the user's public key, a
// command run over ssh as the session's user, and a file copied with
// scp (sftp); another user's ssh gets no connection (404).
func TestSSHProxyCommandE2E(t *testing.T) {
	needBinary(t)
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("needs OpenSSH's client: apt-get install openssh-client")
	}
	image := recipeImage(t, "sshd")
	rt := privateContainerd(t, "voyager-ssh-e2e")
	importImage(t, rt, image)
	env, environ, dev := devOn(t, rt, "ssh-e2e")
	ada := streamUser{t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "ada")}
	bob := streamUser{t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "bob")}

	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	code, out, stderr := ada.run("session", "create", "--kind", "batch", "--image", "voyager.local/sshd:latest", "--cpu", "0.5", "--memory", "512",
		"--env", "SSH_AUTHORIZED_KEYS="+strings.TrimSpace(string(pub)), "-o", "name", "--", "/usr/local/bin/voyager-sshd")
	if code != 0 {
		t.Fatalf("session create: exit %d\n%s", code, stderr)
	}
	id := strings.TrimSpace(out)
	if code, out, stderr := ada.run("session", "wait", "--timeout", "120s", id); code != 0 {
		t.Fatalf("session wait: exit %d\n%s%s", code, out, stderr)
	}

	sshArgs := func(u streamUser, extra ...string) *exec.Cmd {
		args := append([]string{"-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
			"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
			"-o", "ProxyCommand=" + binary + " ssh %h"}, extra...)
		c := exec.Command("ssh", args...)
		c.Env = append(u.environ, envURL+"=http://"+u.http, envToken+"="+u.token)
		return c
	}
	// sshd starts after the container does: retry until it answers.
	var sshOut []byte
	deadline := time.Now().Add(60 * time.Second)
	for {
		sshOut, err = sshArgs(ada, "jovyan@"+id+".voyager", `echo "uid=$(id -u) home=$HOME"; cat /proc/1/status | grep ^Uid; echo ssh-ok`).CombinedOutput()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	o := string(sshOut)
	if err != nil || !strings.Contains(o, "ssh-ok") {
		logs, _, _ := ada.run("session", "logs", id)
		_ = logs
		_, logOut, _ := ada.run("session", "logs", id)
		t.Fatalf("ssh through voyager ssh: %v\n%s\nsession log:\n%s", err, o, logOut)
	}
	m := regexp.MustCompile(`uid=(\d+) home=(\S+)\nUid:\s+(\d+)`).FindStringSubmatch(o)
	if m == nil || m[1] != m[3] {
		t.Errorf("ssh session runs as %q, want the session's own uid (its process 1's)\n%s", m, o)
	}

	// scp over sftp, VS Code's way of copying its server in.
	src := filepath.Join(dir, "payload")
	if err := os.WriteFile(src, []byte(strconv.Itoa(os.Getpid())+"-payload"), 0o600); err != nil {
		t.Fatal(err)
	}
	scpArgs := []string{"-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "ProxyCommand=" + binary + " ssh %h", src, "jovyan@" + id + ":payload"}
	scp := exec.Command("scp", scpArgs...)
	scp.Env = append(ada.environ, envURL+"=http://"+ada.http, envToken+"="+ada.token)
	if out, err := scp.CombinedOutput(); err != nil {
		t.Errorf("scp through voyager ssh: %v %s", err, out)
	} else if code, out, _ := ada.run("session", "exec", id, "--", "cat", "payload"); code != 0 || out != strconv.Itoa(os.Getpid())+"-payload" {
		t.Errorf("the copied file in the session: exit %d, %q", code, out)
	}

	out2, err := sshArgs(bob, "jovyan@"+id, "echo pwned").CombinedOutput()
	if err == nil || strings.Contains(string(out2), "pwned") || !strings.Contains(string(out2), "no session") {
		t.Errorf("bob's ssh into ada's session: %v\n%s\nwant refused: no session", err, out2)
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}
