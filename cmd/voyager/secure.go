package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/internal/httpserver"
)

// listenHTTP binds the process's HTTP listener: HTTPS when
// VOYAGER_HTTP_TLS_CERT is set, else plain HTTP.
func listenHTTP(cfg config.Config, h http.Handler, log *slog.Logger) (*httpserver.Server, error) {
	tc, err := cfg.HTTPTLS()
	if err != nil {
		return nil, err
	}
	hs, err := httpserver.ListenTLS(cfg.HTTPAddr, h, tc, log)
	if err != nil {
		return nil, explainListen(err, "http", cfg.HTTPAddr, config.EnvHTTPAddr)
	}
	return hs, nil
}

// logsHTTPClient is the API's client of the agents' log endpoints. Agents
// serving HTTPS present certificates of the cluster CA (VOYAGER_ETCD_CA,
// the one CA of deploy/README.md), so that CA is trusted besides the
// system's; the API's own HTTPS certificate is presented as a client
// certificate, for agents that require one (VOYAGER_HTTP_CLIENT_CA).
func logsHTTPClient(cfg config.Config) (*http.Client, error) {
	if cfg.EtcdCA == "" && cfg.HTTPTLSCert == "" {
		return &http.Client{}, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.EtcdCA != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		pem, err := os.ReadFile(cfg.EtcdCA)
		if err != nil {
			return nil, fmt.Errorf("read cluster CA (%s): %w", config.EnvEtcdCA, err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("read cluster CA (%s): no PEM certificate in %s", config.EnvEtcdCA, cfg.EtcdCA)
		}
		tc.RootCAs = pool
	}
	if cfg.HTTPTLSCert != "" {
		pair, err := tls.LoadX509KeyPair(cfg.HTTPTLSCert, cfg.HTTPTLSKey)
		if err != nil {
			return nil, fmt.Errorf("load client certificate for agents (%s): %w", config.EnvHTTPTLSCert, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &http.Client{Transport: tr}, nil
}

// secureEnvs are the settings of every process that talks to etcd and
// serves HTTP: etcd's TLS and credentials, the HTTP listener's TLS.
var secureEnvs = []string{
	config.EnvEtcdCA, config.EnvEtcdCert, config.EnvEtcdKey, config.EnvEtcdServerName,
	config.EnvEtcdUser, config.EnvEtcdPassword,
	config.EnvHTTPTLSCert, config.EnvHTTPTLSKey, config.EnvHTTPClientCA,
}
