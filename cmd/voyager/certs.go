package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/internal/pki"
	"github.com/voyager-gpu/voyager/state"
)

var certsCmd = subcommand{
	name: "certs",
	description: `Creates the certificates of a small cluster under -dir: a CA (ca.pem,
ca-key.pem), a serving and peer certificate per etcd member (etcd/<name>.pem),
and one certificate per Voyager identity, whose CN is its etcd user (see
voyager etcd-roles): root, voyager-api, voyager-placer, voyager-operator and
voyager-agent-<node> per node. Each leaf also serves HTTPS (VOYAGER_HTTP_TLS_CERT)
for the hosts given. Files that exist are kept, so it can be run again to
add a member or a node; -renew issues every leaf again from the same CA
(docs/deployment.md: rotation without downtime). Keys are ECDSA P-256,
written 0600.`,
}

// hostsFlag is a repeatable name=host,host flag.
type hostsFlag struct {
	names []string
	hosts [][]string
}

func (h *hostsFlag) String() string { return "" }

func (h *hostsFlag) Set(v string) error {
	name, hosts, _ := strings.Cut(v, "=")
	if err := state.ValidateName("name", name); err != nil {
		return fmt.Errorf("%w (want name=host,host such as gpu-1=10.0.0.21)", err)
	}
	var list []string
	for _, s := range strings.Split(hosts, ",") {
		if s = strings.TrimSpace(s); s != "" {
			list = append(list, s)
		}
	}
	h.names = append(h.names, name)
	h.hosts = append(h.hosts, list)
	return nil
}

// certPlan is one certificate to have under the directory.
type certPlan struct {
	file string // path relative to the directory, without .pem
	req  pki.Request
}

func runCerts(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := certsCmd.flagSet()
	dir := fs.String("dir", "voyager-pki", "directory of the CA and the certificates")
	var members, nodes hostsFlag
	fs.Var(&members, "etcd", "an etcd member as name=host,host (repeatable), e.g. etcd-1=10.0.0.1,etcd-1.lab")
	fs.Var(&nodes, "node", "a GPU machine as name=host,host (repeatable): its agent's certificate")
	apiHosts := fs.String("api-hosts", "", "comma-separated names and IPs the API serves HTTPS on")
	placerHosts := fs.String("placer-hosts", "", "comma-separated names and IPs of the placers' HTTPS (metrics)")
	validity := fs.Duration("validity", 365*24*time.Hour, "validity of each leaf certificate")
	caValidity := fs.Duration("ca-validity", 10*365*24*time.Hour, "validity of a new CA")
	renew := fs.Bool("renew", false, "issue every leaf again from the existing CA (keys too)")
	if code := certsCmd.parse(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if *validity <= 0 || *caValidity <= 0 {
		fmt.Fprintln(stderr, "voyager certs: -validity and -ca-validity must be positive durations, such as 8760h")
		return exitUsage
	}
	split := func(s string) []string {
		var out []string
		for _, h := range strings.Split(s, ",") {
			if h = strings.TrimSpace(h); h != "" {
				out = append(out, h)
			}
		}
		return out
	}
	local := []string{"localhost", "127.0.0.1", "::1"}
	var plan []certPlan
	for i, n := range members.names {
		plan = append(plan, certPlan{"etcd/" + n, pki.Request{CommonName: n, Hosts: append(append([]string{n}, members.hosts[i]...), local...)}})
	}
	plan = append(plan,
		certPlan{etcdrbac.Root, pki.Request{CommonName: etcdrbac.Root}},
		certPlan{etcdrbac.API, pki.Request{CommonName: etcdrbac.API, Hosts: append(split(*apiHosts), local...)}},
		certPlan{etcdrbac.Placer, pki.Request{CommonName: etcdrbac.Placer, Hosts: append(split(*placerHosts), local...)}},
		certPlan{etcdrbac.Operator, pki.Request{CommonName: etcdrbac.Operator}},
	)
	for i, n := range nodes.names {
		user := etcdrbac.Agent(n)
		plan = append(plan, certPlan{user, pki.Request{CommonName: user, Hosts: append(append([]string{n}, nodes.hosts[i]...), local...)}})
	}
	if err := writeCerts(*dir, plan, *validity, *caValidity, *renew, stdout); err != nil {
		fmt.Fprintf(stderr, "voyager certs: %v\n", err)
		return exitError
	}
	return exitOK
}

// writeCerts loads or makes the CA under dir and issues each planned
// certificate that is absent (or all with renew).
func writeCerts(dir string, plan []certPlan, validity, caValidity time.Duration, renew bool, out io.Writer) error {
	caCert, caKey := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	ca, err := pki.LoadCA(caCert, caKey)
	switch {
	case err == nil:
		fmt.Fprintf(out, "kept    %s (CA %q, until %s)\n", caCert, ca.Cert.Subject.CommonName, ca.Cert.NotAfter.Format(time.DateOnly))
	case errors.Is(err, os.ErrNotExist):
		if ca, err = pki.NewCA("Voyager cluster CA", caValidity); err != nil {
			return err
		}
		if err := pki.WriteFile(caKey, ca.KeyPEM(), 0o600); err != nil {
			return err
		}
		if err := pki.WriteFile(caCert, ca.CertPEM, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(out, "created %s\n", caCert)
	default:
		return err
	}
	for _, p := range plan {
		certFile, keyFile := filepath.Join(dir, p.file+".pem"), filepath.Join(dir, p.file+"-key.pem")
		if _, err := os.Stat(certFile); err == nil && !renew {
			fmt.Fprintf(out, "kept    %s\n", certFile)
			continue
		}
		p.req.Validity = validity
		leaf, err := ca.Issue(p.req)
		if err != nil {
			return err
		}
		// The key first: a reloading process that sees the new
		// certificate must find its key.
		if err := pki.WriteFile(keyFile, leaf.KeyPEM, 0o600); err != nil {
			return err
		}
		if err := pki.WriteFile(certFile, leaf.CertPEM, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(out, "created %s (CN %s, hosts %s)\n", certFile, p.req.CommonName, strings.Join(p.req.Hosts, ","))
	}
	return nil
}
