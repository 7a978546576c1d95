package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// validateTLS checks the etcd and HTTP security settings: files that
// exist, pairs given together, a password file for a user.
func validateTLS(cfg Config, invalid func(env, want string) *InvalidError) []error {
	var errs []error
	for _, f := range []struct{ env, path string }{
		{EnvEtcdCA, cfg.EtcdCA}, {EnvEtcdCert, cfg.EtcdCert}, {EnvEtcdKey, cfg.EtcdKey},
		{EnvEtcdPassword, cfg.EtcdPasswordFile},
		{EnvHTTPTLSCert, cfg.HTTPTLSCert}, {EnvHTTPTLSKey, cfg.HTTPTLSKey}, {EnvHTTPClientCA, cfg.HTTPClientCA},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, invalid(f.env, wantFor(f.env)))
		}
	}
	if (cfg.EtcdCert == "") != (cfg.EtcdKey == "") {
		errs = append(errs, invalid(EnvEtcdKey, "both "+EnvEtcdCert+" and "+EnvEtcdKey+" set, or neither"))
	}
	if (cfg.HTTPTLSCert == "") != (cfg.HTTPTLSKey == "") {
		errs = append(errs, invalid(EnvHTTPTLSKey, "both "+EnvHTTPTLSCert+" and "+EnvHTTPTLSKey+" set, or neither"))
	}
	if cfg.HTTPClientCA != "" && cfg.HTTPTLSCert == "" {
		errs = append(errs, invalid(EnvHTTPClientCA, "empty unless "+EnvHTTPTLSCert+" and "+EnvHTTPTLSKey+" are set (client certificates need HTTPS)"))
	}
	if strings.ContainsAny(cfg.EtcdUser, ": \t") {
		errs = append(errs, invalid(EnvEtcdUser, wantFor(EnvEtcdUser)))
	}
	if cfg.EtcdUser != "" && cfg.EtcdPasswordFile == "" {
		errs = append(errs, invalid(EnvEtcdPassword, wantFor(EnvEtcdPassword)))
	}
	return errs
}

// EtcdTLS returns the TLS configuration of etcd clients, or nil when
// neither a CA, a client certificate nor an https:// endpoint asks for TLS
// (then the system's roots verify an https:// endpoint).
func (c Config) EtcdTLS() (*tls.Config, error) {
	https := false
	for _, ep := range c.EtcdEndpoints {
		https = https || strings.HasPrefix(ep, "https://")
	}
	if c.EtcdCA == "" && c.EtcdCert == "" && !https {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.EtcdServerName}
	if c.EtcdCA != "" {
		pool, err := loadPool(c.EtcdCA)
		if err != nil {
			return nil, fmt.Errorf("load etcd CA (%s): %w", EnvEtcdCA, err)
		}
		tc.RootCAs = pool
	}
	if c.EtcdCert != "" {
		r, err := newCertReloader(c.EtcdCert, c.EtcdKey)
		if err != nil {
			return nil, fmt.Errorf("load etcd client certificate (%s, %s): %w", EnvEtcdCert, EnvEtcdKey, err)
		}
		// Read per handshake, so that a renewed certificate is used from
		// the next connection on.
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return r.load() }
	}
	return tc, nil
}

// EtcdKeepAlive is how long an etcd client's connection goes without
// traffic before the client pings the member; etcd refuses pings more often
// than every 5 s (its --grpc-keepalive-min-time) by closing the connection.
const EtcdKeepAlive = 10 * time.Second

// EtcdKeepAliveTimeout is how long an etcd client waits for the answer to
// a ping before it closes the connection and dials again.
const EtcdKeepAliveTimeout = 5 * time.Second

// EtcdClientConfig returns the configuration of a client of the external
// etcd cluster: endpoints, dial timeout, TLS and credentials. Every
// Voyager process that connects to an external etcd builds its client
// from it, so that TLS and authentication hold for all of them.
func (c Config) EtcdClientConfig() (clientv3.Config, error) {
	tc, err := c.EtcdTLS()
	if err != nil {
		return clientv3.Config{}, err
	}
	eps := c.EtcdEndpoints
	if tc != nil {
		// A bare host:port would be dialled in plain text: TLS was asked
		// for, so say so in the scheme.
		eps = make([]string, len(c.EtcdEndpoints))
		for i, ep := range c.EtcdEndpoints {
			if !strings.Contains(ep, "://") {
				ep = "https://" + ep
			}
			eps[i] = ep
		}
	}
	cc := clientv3.Config{
		Endpoints:   eps,
		DialTimeout: c.EtcdDialTimeout,
		// A member that goes silent without a reset (power lost, link
		// cut) leaves its connection open: without pings, calls and
		// watches on it hang until TCP gives up, many minutes later.
		// gRPC's keepalive closes it after EtcdKeepAlive plus
		// EtcdKeepAliveTimeout, and the client moves to the other
		// members.
		DialKeepAliveTime:    EtcdKeepAlive,
		DialKeepAliveTimeout: EtcdKeepAliveTimeout,
		TLS:                  tc,
		Logger:               zap.NewNop(),
	}
	if c.EtcdUser != "" {
		pw, err := readSecretFile(c.EtcdPasswordFile)
		if err != nil {
			return clientv3.Config{}, fmt.Errorf("read etcd password (%s): %w", EnvEtcdPassword, err)
		}
		cc.Username, cc.Password = c.EtcdUser, pw
	}
	return cc, nil
}

// HTTPTLS returns the TLS configuration of the HTTP listener, or nil when
// it serves plain HTTP. The certificate is read again from disk when it
// changed, so a renewed certificate is served without a restart.
func (c Config) HTTPTLS() (*tls.Config, error) {
	if c.HTTPTLSCert == "" {
		return nil, nil
	}
	r, err := newCertReloader(c.HTTPTLSCert, c.HTTPTLSKey)
	if err != nil {
		return nil, fmt.Errorf("load HTTPS certificate (%s, %s): %w", EnvHTTPTLSCert, EnvHTTPTLSKey, err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.get}
	if c.HTTPClientCA != "" {
		pool, err := loadPool(c.HTTPClientCA)
		if err != nil {
			return nil, fmt.Errorf("load HTTP client CA (%s): %w", EnvHTTPClientCA, err)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// ErrPlainHTTP is returned by RequireSecureHTTP for plain HTTP on a
// non-loopback address.
var ErrPlainHTTP = errors.New("plain HTTP on a non-loopback address")

// RequireSecureHTTP refuses plain HTTP on an address other hosts can
// reach, unless HTTPPlain says a TLS-terminating proxy stands in front.
// Tokens travel in every request: on a network they need TLS.
func (c Config) RequireSecureHTTP() error {
	if c.HTTPTLSCert != "" || c.HTTPPlain {
		return nil
	}
	host, _, err := net.SplitHostPort(c.HTTPAddr)
	if err != nil {
		return fmt.Errorf("check %s: %w", EnvHTTPAddr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w: %s=%s would carry tokens in clear text; set %s and %s to serve HTTPS, or listen on 127.0.0.1 behind a TLS proxy, or set %s=true when a TLS-terminating proxy on a trusted network stands in front",
		ErrPlainHTTP, EnvHTTPAddr, c.HTTPAddr, EnvHTTPTLSCert, EnvHTTPTLSKey, EnvHTTPPlain)
}

// HTTPScheme is "https" when the listener serves TLS, else "http".
func (c Config) HTTPScheme() string {
	if c.HTTPTLSCert != "" {
		return "https"
	}
	return "http"
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("read CA file %s: no PEM certificate in it", path)
	}
	return pool, nil
}

func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read secret file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimRight(line, "\r")
	if line == "" {
		return "", fmt.Errorf("read secret file %s: its first line is empty", path)
	}
	return line, nil
}
