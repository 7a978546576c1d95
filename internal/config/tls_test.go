package config

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/pki"
)

// writePKI writes a CA and one leaf for 127.0.0.1 under a temporary
// directory and returns the paths of ca.pem, leaf.pem and leaf-key.pem.
func writePKI(t *testing.T) (ca, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	c, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Issue(pki.Request{CommonName: "voyager-api", Hosts: []string{"127.0.0.1"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "leaf.pem"), filepath.Join(dir, "leaf-key.pem")
	for p, b := range map[string][]byte{ca: c.CertPEM, cert: l.CertPEM, key: l.KeyPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return ca, cert, key
}

func TestLoadSecuritySettings(t *testing.T) {
	ca, cert, key := writePKI(t)
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\nignored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"HOME=/home/u", "VOYAGER_ETCD_ENDPOINTS=10.0.0.1:2379,https://10.0.0.2:2379"}
	cases := []struct {
		name    string
		env     []string
		invalid []string // variables the error must name; none: valid
	}{
		{"all set", []string{"VOYAGER_ETCD_CA=" + ca, "VOYAGER_ETCD_CERT=" + cert, "VOYAGER_ETCD_KEY=" + key,
			"VOYAGER_ETCD_USER=voyager-api", "VOYAGER_ETCD_PASSWORD_FILE=" + pw,
			"VOYAGER_HTTP_TLS_CERT=" + cert, "VOYAGER_HTTP_TLS_KEY=" + key, "VOYAGER_HTTP_CLIENT_CA=" + ca}, nil},
		{"missing CA file", []string{"VOYAGER_ETCD_CA=/nonexistent/ca.pem"}, []string{"VOYAGER_ETCD_CA"}},
		{"cert without key", []string{"VOYAGER_ETCD_CERT=" + cert}, []string{"VOYAGER_ETCD_KEY"}},
		{"user without password file", []string{"VOYAGER_ETCD_USER=voyager-api"}, []string{"VOYAGER_ETCD_PASSWORD_FILE"}},
		{"user with a colon", []string{"VOYAGER_ETCD_USER=a:b", "VOYAGER_ETCD_PASSWORD_FILE=" + pw}, []string{"VOYAGER_ETCD_USER"}},
		{"https key without cert", []string{"VOYAGER_HTTP_TLS_KEY=" + key}, []string{"VOYAGER_HTTP_TLS_KEY"}},
		{"client CA without https", []string{"VOYAGER_HTTP_CLIENT_CA=" + ca}, []string{"VOYAGER_HTTP_CLIENT_CA"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Load(append(append([]string{}, base...), c.env...), nil)
			if len(c.invalid) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				cc, err := cfg.EtcdClientConfig()
				if err != nil {
					t.Fatal(err)
				}
				if cc.TLS == nil || cc.Username != "voyager-api" || cc.Password != "s3cret" ||
					cc.Endpoints[0] != "https://10.0.0.1:2379" || cc.Endpoints[1] != "https://10.0.0.2:2379" {
					t.Errorf("client config: TLS %v, user %q, password %q, endpoints %v", cc.TLS != nil, cc.Username, cc.Password, cc.Endpoints)
				}
				return
			}
			for _, v := range c.invalid {
				var ie *InvalidError
				if err == nil || !errors.As(err, &ie) || !strings.Contains(err.Error(), v) {
					t.Errorf("Load: %v; want an invalid %s", err, v)
				}
			}
		})
	}
}

func TestRequireSecureHTTP(t *testing.T) {
	_, cert, key := writePKI(t)
	for _, c := range []struct {
		addr  string
		extra []string
		ok    bool
	}{
		{"127.0.0.1:7070", nil, true},
		{"localhost:7070", nil, true},
		{"[::1]:7070", nil, true},
		{"0.0.0.0:7070", nil, false},
		{"10.0.0.10:443", nil, false},
		{"10.0.0.10:443", []string{"VOYAGER_HTTP_TLS_CERT=" + cert, "VOYAGER_HTTP_TLS_KEY=" + key}, true},
		{"10.0.0.10:8080", []string{"VOYAGER_HTTP_PLAIN=true"}, true},
	} {
		cfg, err := Load(append([]string{"HOME=/home/u", "VOYAGER_HTTP_ADDR=" + c.addr}, c.extra...), nil)
		if err != nil {
			t.Fatal(err)
		}
		err = cfg.RequireSecureHTTP()
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, ErrPlainHTTP)) {
			t.Errorf("%s %v: %v; want ok=%v", c.addr, c.extra, err, c.ok)
		}
	}
}

// TestHTTPTLSReloads: a certificate replaced on disk is served from the
// next handshake on, without a restart.
func TestHTTPTLSReloads(t *testing.T) {
	_, cert, key := writePKI(t)
	cfg, err := Load([]string{"HOME=/home/u", "VOYAGER_HTTP_TLS_CERT=" + cert, "VOYAGER_HTTP_TLS_KEY=" + key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := cfg.HTTPTLS()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tc)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	serial := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := serial()
	// Renew from another CA into the same files, with a later mtime.
	_, cert2, key2 := writePKI(t)
	for src, dst := range map[string]string{key2: key, cert2: cert} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := pki.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Minute)
		if err := os.Chtimes(dst, later, later); err != nil {
			t.Fatal(err)
		}
	}
	if second := serial(); second == first {
		t.Fatalf("still serving certificate %s after the files were replaced", first)
	}
}

// TestEtcdClientLeavesASilentMember: one of two etcd endpoints goes silent
// without a reset (its connection stays open and carries nothing), as a
// member whose machine lost power does. Reads with no deadline of their
// own, through a client built from EtcdClientConfig, all still answer: the
// keepalive pings find the silent connection dead and the reads stuck on it
// are retried on the other endpoint. Without the pings such a read hangs
// until TCP gives up, many minutes later.
func TestEtcdClientLeavesASilentMember(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	silent, live := etcdtest.NewProxy(t, c.Server.Endpoint()), etcdtest.NewProxy(t, c.Server.Endpoint())
	cc, err := Config{EtcdEndpoints: []string{silent.Endpoint(), live.Endpoint()}, EtcdDialTimeout: 2 * time.Second}.EtcdClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // the test's bound, not the reads'
	defer cancel()
	for range 4 { // both connections up
		if _, err := cli.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	silent.Cut()
	cut := time.Now()
	limit := EtcdKeepAlive + EtcdKeepAliveTimeout + 10*time.Second
	for i := range 6 {
		start := time.Now()
		if _, err := cli.Get(ctx, "k"); err != nil {
			t.Fatalf("read %d after the cut: %v", i, err)
		}
		if took := time.Since(start); took > limit {
			t.Fatalf("read %d took %s; want under the keepalive's %s plus %s and 10 s", i, took.Round(time.Millisecond), EtcdKeepAlive, EtcdKeepAliveTimeout)
		}
	}
	t.Logf("six reads answered within %s of one endpoint going silent", time.Since(cut).Round(time.Millisecond))
}
