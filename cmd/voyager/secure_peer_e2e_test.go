package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"path/filepath"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdrbac"
)

// checkPeerPort: etcd's replication port refuses the certificates of the
// cluster CA that components and operators hold (an agent's, the
// operator's, root's), and no certificate at all, while a member's peer
// certificate (the peer CA's) gets the member list: the port is shut to
// everybody but the members, not to everybody.
func (c *secureCluster) checkPeerPort(ctx context.Context, nodes []string) {
	t := c.t
	t.Helper()
	get := func(u string, cert *tls.Certificate) (int, error) {
		tc := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the probe asks whether the server lets this client in
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return 0, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	load := func(file string) *tls.Certificate {
		pair, err := tls.LoadX509KeyPair(filepath.Join(c.pki, file+".pem"), filepath.Join(c.pki, file+"-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		return &pair
	}
	member := ""
	for name := range c.members {
		member = name
		break
	}
	for _, peer := range c.peers {
		for _, probe := range []struct {
			who  string
			cert *tls.Certificate
		}{
			{"an agent's certificate", load(etcdrbac.Agent(nodes[0]))},
			{"the operator's certificate", load(etcdrbac.Operator)},
			{"root's certificate", load(etcdrbac.Root)},
			{"a member's serving certificate (the cluster CA's)", load("etcd/" + member)},
			{"no certificate", nil},
		} {
			for _, path := range []string{"/members", "/raft/probing"} {
				if code, err := get(peer+path, probe.cert); err == nil && code < 400 {
					t.Errorf("peer port %s answered %s with %s: %d; want it refused", peer, path, probe.who, code)
				}
			}
		}
		if code, err := get(peer+"/members", load("etcd/"+member+"-peer")); err != nil || code != http.StatusOK {
			t.Errorf("peer port %s with a member's peer certificate: %d %v; want the member list", peer, code, err)
		}
	}
}
