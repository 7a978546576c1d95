package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority: its certificate and signing key.
type CA struct {
	// Cert is the CA's certificate.
	Cert *x509.Certificate
	// CertPEM is Cert, PEM-encoded.
	CertPEM []byte
	key     crypto.Signer
	keyPEM  []byte
}

// Leaf is an issued certificate and its key, PEM-encoded.
type Leaf struct {
	CertPEM []byte
	KeyPEM  []byte
}

// Request describes a leaf certificate.
type Request struct {
	// CommonName is the subject's CN; for an etcd client it is the etcd
	// user the certificate logs in as (etcd's --client-cert-auth).
	CommonName string
	// Hosts are the DNS names and IP addresses the certificate serves.
	Hosts []string
	// Validity is how long it is valid from now.
	Validity time.Duration
	// ClientOnly limits the certificate to client authentication (no
	// serverAuth usage): for identities that never serve, such as root
	// and the operator, so that a stolen one cannot pose as a server.
	ClientOnly bool
}

// NewCA makes a self-signed CA named cn, valid for validity.
func NewCA(cn string, validity time.Duration) (*CA, error) {
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("make CA: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("make CA: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"Voyager"}},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("make CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("make CA: %w", err)
	}
	return &CA{Cert: cert, CertPEM: encodeCert(der), key: key, keyPEM: keyPEM}, nil
}

// LoadCA reads a CA's certificate and key from PEM files.
func LoadCA(certFile, keyFile string) (*CA, error) {
	cb, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	block, _ := pem.Decode(cb)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("load CA: %s holds no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load CA: parse %s: %w", certFile, err)
	}
	kblock, _ := pem.Decode(kb)
	if kblock == nil {
		return nil, fmt.Errorf("load CA: %s holds no PEM key", keyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(kblock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load CA: parse %s: %w", keyFile, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("load CA: %s is not a signing key", keyFile)
	}
	return &CA{Cert: cert, CertPEM: cb, key: signer, keyPEM: kb}, nil
}

// KeyPEM is the CA's private key, PEM-encoded (PKCS #8).
func (ca *CA) KeyPEM() []byte { return ca.keyPEM }

// Issue signs a leaf certificate for r. It may serve TLS and authenticate
// as a TLS client.
func (ca *CA) Issue(r Request) (Leaf, error) {
	if r.CommonName == "" {
		return Leaf{}, errors.New("issue certificate: empty common name")
	}
	if r.Validity <= 0 {
		return Leaf{}, fmt.Errorf("issue certificate for %s: validity %s is not positive", r.CommonName, r.Validity)
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return Leaf{}, fmt.Errorf("issue certificate for %s: %w", r.CommonName, err)
	}
	serial, err := newSerial()
	if err != nil {
		return Leaf{}, fmt.Errorf("issue certificate for %s: %w", r.CommonName, err)
	}
	now := time.Now()
	notAfter := now.Add(r.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: r.CommonName, Organization: []string{"Voyager"}},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if r.ClientOnly {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, h := range r.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return Leaf{}, fmt.Errorf("issue certificate for %s: %w", r.CommonName, err)
	}
	return Leaf{CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// WriteFile writes data to path through a temporary file and a rename, so
// that a process reading it (a reloading listener) never sees half a file.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err == nil {
		_, err = tmp.Write(data)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func newKey() (crypto.Signer, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("make serial number: %w", err)
	}
	return n, nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
