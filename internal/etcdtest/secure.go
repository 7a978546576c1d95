package etcdtest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/voyager-gpu/voyager/internal/pki"
)

// Secure is Debian's etcd serving TLS only, with --client-cert-auth: the CN
// of a client's certificate is its etcd user once authentication is on.
type Secure struct {
	// Endpoint is the https:// client URL.
	Endpoint string
	// CA signed the server's certificate and the clients'; CAFile holds it.
	CA     *pki.CA
	CAFile string
	dir    string
	proc   *External // the process, for CPU
}

// StartSecure starts Debian's etcd with TLS and client-certificate
// authentication on free loopback ports, waits until a root client answers,
// and stops it at cleanup. Authentication itself is off until a test turns
// it on (etcdrbac.Setup does).
func StartSecure(tb testing.TB) *Secure {
	tb.Helper()
	return StartSecureWith(tb, ExternalOptions{})
}

// StartSecureWith is StartSecure with options (fsync, CPUs).
func StartSecureWith(tb testing.TB, opts ExternalOptions) *Secure {
	tb.Helper()
	path := etcdBinary(tb)
	dir := tb.TempDir()
	ca, err := pki.NewCA("voyager test CA", time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	s := &Secure{CA: ca, CAFile: filepath.Join(dir, "ca.pem"), dir: dir}
	if err := os.WriteFile(s.CAFile, ca.CertPEM, 0o644); err != nil {
		tb.Fatal(err)
	}
	member, err := ca.Issue(pki.Request{CommonName: "etcd-test", Hosts: []string{"localhost", "127.0.0.1"}, Validity: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	certFile, keyFile := s.writePair(tb, "member", member)
	client, peer := FreeAddr(tb), FreeAddr(tb)
	s.Endpoint = "https://" + client
	s.proc = runWith(tb, opts, s.Endpoint, path, dir,
		"--name", "test",
		"--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", s.Endpoint,
		"--advertise-client-urls", s.Endpoint,
		"--listen-peer-urls", "http://"+peer,
		"--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "test=http://"+peer,
		"--cert-file", certFile, "--key-file", keyFile,
		"--trusted-ca-file", s.CAFile, "--client-cert-auth",
		"--log-level", "error",
	)
	waitAnswers(tb, s.Client(tb, "root"), dir)
	return s
}

// CPU is the CPU time the server's process has used so far (External.CPU).
func (s *Secure) CPU() (time.Duration, error) { return s.proc.CPU() }

// writePair writes a leaf's certificate and key under the server's
// directory and returns their paths.
func (s *Secure) writePair(tb testing.TB, name string, l pki.Leaf) (certFile, keyFile string) {
	tb.Helper()
	certFile, keyFile = filepath.Join(s.dir, name+".pem"), filepath.Join(s.dir, name+"-key.pem")
	if err := os.WriteFile(certFile, l.CertPEM, 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(keyFile, l.KeyPEM, 0o600); err != nil {
		tb.Fatal(err)
	}
	return certFile, keyFile
}

// ClientFiles issues a client certificate with CN user and returns the
// paths of its certificate and key (for processes and etcdctl).
func (s *Secure) ClientFiles(tb testing.TB, user string) (certFile, keyFile string) {
	tb.Helper()
	l, err := s.CA.Issue(pki.Request{CommonName: user, Validity: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	return s.writePair(tb, "client-"+user, l)
}

// Client returns a client authenticated by a certificate with CN user,
// closed at cleanup.
func (s *Secure) Client(tb testing.TB, user string) *clientv3.Client {
	tb.Helper()
	certFile, keyFile := s.ClientFiles(tb, user)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		tb.Fatal(err)
	}
	return s.ClientTLS(tb, &tls.Config{Certificates: []tls.Certificate{pair}})
}

// ClientTLS returns a client with tc (RootCAs defaults to the server's CA),
// closed at cleanup; what it may do is for the test to find out.
func (s *Secure) ClientTLS(tb testing.TB, tc *tls.Config) *clientv3.Client {
	tb.Helper()
	if tc.RootCAs == nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(s.CA.CertPEM)
		tc.RootCAs = pool
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, TLS: tc, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}
