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

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/internal/etcdrbac"
	"github.com/voyager-gpu/voyager/internal/pki"
	"github.com/voyager-gpu/voyager/state"
)

const certsLong = `Creates the certificates of a small cluster under --dir: a CA (ca.pem,
ca-key.pem), a serving certificate per etcd member (etcd/<name>.pem), and one
certificate per Voyager identity, whose CN is its etcd user (see voyager
etcd-roles): root, voyager-api, voyager-placer, voyager-operator and
voyager-agent-<node> per node. The API's, placers' and agents' leaves also
serve HTTPS (VOYAGER_HTTP_TLS_CERT) for the hosts given; root's and the
operator's are for client use only.

etcd's replication (peer) port gets a CA of its own (peer-ca.pem,
peer-ca-key.pem) and one peer certificate per member (etcd/<name>-peer.pem,
CN ` + peerCN + `): a member trusts only that CA on its peer port
(ETCD_PEER_TRUSTED_CA_FILE) and only that CN (ETCD_PEER_CERT_ALLOWED_CN),
so no component's or operator's certificate reaches it.

Files that exist are kept, so it can be run again to add a member or a
node; --renew issues every leaf again from the same CAs (docs/deployment.md:
rotation without downtime). Keys are ECDSA P-256, written 0600.`

// peerCN is the common name of every etcd member's peer certificate, the
// one CN the members' peer ports allow (ETCD_PEER_CERT_ALLOWED_CN; etcd
// 3.4 takes one name).
const peerCN = "voyager-etcd-peer"

// certsOptions are voyager certs' flags.
type certsOptions struct {
	dir                   string
	members, nodes        hostsFlag
	apiHosts, placerHosts string
	validity, caValidity  time.Duration
	renew                 bool
}

func newCertsCmd() *cobra.Command {
	var o certsOptions
	cmd := &cobra.Command{
		Use:     "certs",
		Short:   "Create a CA and the certificates of etcd members, components and nodes",
		Long:    certsLong,
		Example: "  voyager certs --dir pki --etcd etcd-1=10.0.0.1 --etcd etcd-2=10.0.0.2 --etcd etcd-3=10.0.0.3 \\\n    --api-hosts api.lab,10.0.0.10 --node gpu-1=10.0.0.21 --node gpu-2=10.0.0.22",
		GroupID: groupDeploy,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withCode(runCerts(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr()))
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", "voyager-pki", "directory of the CA and the certificates")
	f.Var(&o.members, "etcd", "an etcd member as name=host,host (repeatable), e.g. etcd-1=10.0.0.1,etcd-1.lab")
	f.Var(&o.nodes, "node", "a GPU machine as name=host,host (repeatable): its agent's certificate")
	f.StringVar(&o.apiHosts, "api-hosts", "", "comma-separated names and IPs the API serves HTTPS on")
	f.StringVar(&o.placerHosts, "placer-hosts", "", "comma-separated names and IPs of the placers' HTTPS (metrics)")
	f.DurationVar(&o.validity, "validity", 365*24*time.Hour, "validity of each leaf certificate")
	f.DurationVar(&o.caValidity, "ca-validity", 10*365*24*time.Hour, "validity of a new CA")
	f.BoolVar(&o.renew, "renew", false, "issue every leaf again from the existing CA (keys too)")
	return cmd
}

// hostsFlag is a repeatable name=host,host flag.
type hostsFlag struct {
	names []string
	hosts [][]string
}

func (h *hostsFlag) String() string { return strings.Join(h.names, ",") }

// Type names the flag's value in --help.
func (h *hostsFlag) Type() string { return "name=host,…" }

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

// runCerts writes the certificates o asks for and returns the exit code.
func runCerts(_ context.Context, o certsOptions, stdout, stderr io.Writer) int {
	if o.validity <= 0 || o.caValidity <= 0 {
		fmt.Fprintln(stderr, "voyager certs: --validity and --ca-validity must be positive durations, such as 8760h")
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
	var plan, peers []certPlan
	for i, n := range o.members.names {
		hosts := append(append([]string{n}, o.members.hosts[i]...), local...)
		plan = append(plan, certPlan{"etcd/" + n, pki.Request{CommonName: n, Hosts: hosts}})
		peers = append(peers, certPlan{"etcd/" + n + "-peer", pki.Request{CommonName: peerCN, Hosts: hosts}})
	}
	plan = append(plan,
		certPlan{etcdrbac.Root, pki.Request{CommonName: etcdrbac.Root, ClientOnly: true}},
		certPlan{etcdrbac.API, pki.Request{CommonName: etcdrbac.API, Hosts: append(split(o.apiHosts), local...)}},
		certPlan{etcdrbac.Placer, pki.Request{CommonName: etcdrbac.Placer, Hosts: append(split(o.placerHosts), local...)}},
		certPlan{etcdrbac.Operator, pki.Request{CommonName: etcdrbac.Operator, ClientOnly: true}},
	)
	for i, n := range o.nodes.names {
		user := etcdrbac.Agent(n)
		plan = append(plan, certPlan{user, pki.Request{CommonName: user, Hosts: append(append([]string{n}, o.nodes.hosts[i]...), local...)}})
	}
	if err := writeCerts(o.dir, "ca", "Voyager cluster CA", plan, o.validity, o.caValidity, o.renew, stdout); err != nil {
		fmt.Fprintf(stderr, "voyager certs: %v\n", err)
		return exitError
	}
	if len(peers) > 0 {
		if err := writeCerts(o.dir, "peer-ca", "Voyager etcd peer CA", peers, o.validity, o.caValidity, o.renew, stdout); err != nil {
			fmt.Fprintf(stderr, "voyager certs: %v\n", err)
			return exitError
		}
	}
	return exitOK
}

// writeCerts loads or makes the CA named caName (cn on a new one) under
// dir and issues each planned certificate that is absent (or all with
// renew).
func writeCerts(dir, caName, cn string, plan []certPlan, validity, caValidity time.Duration, renew bool, out io.Writer) error {
	caCert, caKey := filepath.Join(dir, caName+".pem"), filepath.Join(dir, caName+"-key.pem")
	ca, err := pki.LoadCA(caCert, caKey)
	switch {
	case err == nil:
		fmt.Fprintf(out, "kept    %s (CA %q, until %s)\n", caCert, ca.Cert.Subject.CommonName, ca.Cert.NotAfter.Format(time.DateOnly))
	case errors.Is(err, os.ErrNotExist):
		if ca, err = pki.NewCA(cn, caValidity); err != nil {
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
