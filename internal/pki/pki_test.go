package pki_test

import (
	"crypto/x509"
	"encoding/pem"
	"path/filepath"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/pki"
)

func parse(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIssueVerifiesAgainstItsCA(t *testing.T) {
	ca, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Through files, as voyager certs keeps it.
	dir := t.TempDir()
	if err := pki.WriteFile(filepath.Join(dir, "ca.pem"), ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFile(filepath.Join(dir, "ca-key.pem"), ca.KeyPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	loaded, err := pki.LoadCA(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := loaded.Issue(pki.Request{CommonName: "voyager-agent-gpu-1", Hosts: []string{"gpu-1", "10.0.0.21"}, Validity: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert := parse(t, leaf.CertPEM)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, host := range []string{"gpu-1", "10.0.0.21"} {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{use}}); err != nil {
				t.Errorf("verify for %s as %v: %v", host, use, err)
			}
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "gpu-2"}); err == nil {
		t.Error("the certificate verifies for a host it does not name")
	}
	if cert.Subject.CommonName != "voyager-agent-gpu-1" {
		t.Errorf("CN %q", cert.Subject.CommonName)
	}
	if cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("leaf valid until %s, past its CA (%s)", cert.NotAfter, ca.Cert.NotAfter)
	}
	other, err := pki.NewCA("other CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(other.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: otherRoots, DNSName: "gpu-1"}); err == nil {
		t.Error("the certificate verifies against another CA")
	}
}

func TestIssueRefusesBadRequests(t *testing.T) {
	ca, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]pki.Request{
		"no CN":       {Validity: time.Hour},
		"no validity": {CommonName: "x"},
	} {
		if _, err := ca.Issue(r); err == nil {
			t.Errorf("%s: issued", name)
		}
	}
}
