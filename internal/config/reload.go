package config

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// certReloader serves a key pair from disk and loads it again when either
// file's modification time changes: certificates are rotated by replacing
// the files, without a restart (docs/deployment.md).
type certReloader struct {
	certFile, keyFile string

	mu      sync.Mutex
	pair    *tls.Certificate
	modCert time.Time
	modKey  time.Time
}

func newCertReloader(certFile, keyFile string) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile}
	if _, err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

// load returns the current pair, reading the files again if they changed.
// A pair that fails to load (a rotation half done) keeps the old one.
func (r *certReloader) load() (*tls.Certificate, error) {
	ci, err := os.Stat(r.certFile)
	if err != nil {
		return r.keep(fmt.Errorf("stat certificate: %w", err))
	}
	ki, err := os.Stat(r.keyFile)
	if err != nil {
		return r.keep(fmt.Errorf("stat key: %w", err))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pair != nil && ci.ModTime().Equal(r.modCert) && ki.ModTime().Equal(r.modKey) {
		return r.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		if r.pair != nil {
			return r.pair, nil
		}
		return nil, fmt.Errorf("load key pair: %w", err)
	}
	r.pair, r.modCert, r.modKey = &pair, ci.ModTime(), ki.ModTime()
	return r.pair, nil
}

func (r *certReloader) keep(err error) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pair != nil {
		return r.pair, nil
	}
	return nil, err
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.load() }
