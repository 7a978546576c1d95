package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// transportDiffs probes every member of the cluster cli reaches, as
// voyager etcd-roles check does: its client URLs must be HTTPS and refuse
// a client without a certificate (etcd's roles rest on the certificate's
// CN), and its peer URLs must be HTTPS and refuse both no certificate and
// the client certificate of tc (a certificate of the cluster CA, as every
// component's and the operator's is): the replication port answers
// whoever it trusts without any role. It returns one line per hole, with
// the setting that closes it.
func transportDiffs(ctx context.Context, cli *clientv3.Client, tc *tls.Config) []string {
	if tc == nil {
		return []string{"the connection to etcd is not TLS: set VOYAGER_ETCD_CA (and serve etcd's client URLs over https with ETCD_CLIENT_CERT_AUTH=true)"}
	}
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return []string{fmt.Sprintf("list the members to probe their ports: %v", err)}
	}
	var out []string
	for _, m := range resp.Members {
		for _, u := range m.ClientURLs {
			switch {
			case !isHTTPS(u):
				out = append(out, fmt.Sprintf("member %s serves clients in clear text on %s: serve https (ETCD_LISTEN_CLIENT_URLS, ETCD_CERT_FILE)", m.Name, u))
			case answers(ctx, u+"/version", nil):
				out = append(out, fmt.Sprintf("member %s answers a client without a certificate on %s: set ETCD_CLIENT_CERT_AUTH=true", m.Name, u))
			}
		}
		for _, u := range m.PeerURLs {
			switch {
			case !isHTTPS(u):
				out = append(out, fmt.Sprintf("member %s replicates in clear text on %s: serve https (ETCD_LISTEN_PEER_URLS, ETCD_PEER_CERT_FILE)", m.Name, u))
			case answers(ctx, u+"/members", nil):
				out = append(out, fmt.Sprintf("member %s's peer port %s answers a client without a certificate: set ETCD_PEER_CLIENT_CERT_AUTH=true", m.Name, u))
			case answers(ctx, u+"/members", tc):
				out = append(out, fmt.Sprintf("member %s's peer port %s accepts this client's certificate (of the cluster CA): give peers their own CA and CN (voyager certs: peer-ca.pem, etcd/<name>-peer.pem; ETCD_PEER_TRUSTED_CA_FILE=peer-ca.pem, ETCD_PEER_CERT_ALLOWED_CN=%s)", m.Name, u, peerCN))
			}
		}
	}
	return out
}

func isHTTPS(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.Scheme == "https"
}

// answers reports whether GET u succeeds (200) with the client
// certificate of tc (none when tc is nil). It does not verify the
// server: it asks whether the server lets this client in, not who the
// server is, and sends nothing but the GET.
func answers(ctx context.Context, u string, tc *tls.Config) bool {
	probe := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // a probe of the server's client check, see above
	if tc != nil {
		probe.Certificates, probe.GetClientCertificate = tc.Certificates, tc.GetClientCertificate
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: probe, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
