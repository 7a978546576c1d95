package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/voyager-gpu/voyager/internal/etcdrbac"
)

// TestCertsSeparatePeers: voyager certs gives etcd's peer port a CA of its
// own: each member's peer certificate is signed by it (CN peerCN), no
// component's or the operator's certificate verifies against it, and the
// identities that never serve (root, the operator) get client-only
// certificates.
func TestCertsSeparatePeers(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	root := newRootCmd(&out, &errb)
	root.SetArgs([]string{"certs", "--dir", dir, "--etcd", "etcd-1=10.0.0.1", "--etcd", "etcd-2=10.0.0.2", "--node", "gpu-1=10.0.0.21"})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("voyager certs: %v\n%s", err, errb.String())
	}
	load := func(f string) *x509.Certificate {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	pool := func(f string) *x509.CertPool {
		p := x509.NewCertPool()
		p.AddCert(load(f))
		return p
	}
	peerCA, clusterCA := pool("peer-ca.pem"), pool("ca.pem")
	if bytes.Equal(load("peer-ca.pem").Raw, load("ca.pem").Raw) {
		t.Fatal("the peer CA is the cluster CA")
	}
	verify := func(c *x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
		_, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}})
		return err
	}
	for _, m := range []string{"etcd-1", "etcd-2"} {
		c := load("etcd/" + m + "-peer.pem")
		if c.Subject.CommonName != peerCN || verify(c, peerCA, x509.ExtKeyUsageClientAuth) != nil || verify(c, peerCA, x509.ExtKeyUsageServerAuth) != nil {
			t.Errorf("%s's peer certificate: CN %q; want %q, signed by the peer CA for both ends", m, c.Subject.CommonName, peerCN)
		}
		if verify(c, clusterCA, x509.ExtKeyUsageClientAuth) == nil {
			t.Errorf("%s's peer certificate is a client of the cluster CA too", m)
		}
	}
	for _, f := range []string{"root.pem", "voyager-operator.pem", "voyager-api.pem", "voyager-placer.pem", "voyager-agent-gpu-1.pem", "etcd/etcd-1.pem"} {
		c := load(f)
		if verify(c, peerCA, x509.ExtKeyUsageClientAuth) == nil {
			t.Errorf("%s (CN %s) verifies against the peer CA: it would reach the peer port", f, c.Subject.CommonName)
		}
		if verify(c, clusterCA, x509.ExtKeyUsageClientAuth) != nil {
			t.Errorf("%s is no client of the cluster CA", f)
		}
		serves := slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		if never := c.Subject.CommonName == etcdrbac.Root || c.Subject.CommonName == etcdrbac.Operator; serves == never {
			t.Errorf("%s (CN %s) serverAuth %v; want it only for identities that serve", f, c.Subject.CommonName, serves)
		}
	}
}
