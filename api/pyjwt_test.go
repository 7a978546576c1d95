package api_test

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pyMint is a tiny token minter over Debian's python3-jwt (PyJWT), an
// implementation independent of the one the API uses.
const pyMint = `
import json, sys, jwt
alg, keyfile, claims = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
key = open(keyfile, "rb").read() if keyfile != "-" else None
if alg == "none":
    print(jwt.encode(claims, None, algorithm="none"))
else:
    print(jwt.encode(claims, key, algorithm=alg))
`

// TestTokensFromPyJWT checks that tokens minted by PyJWT are accepted and
// refused exactly as the API's own rules say.
func TestTokensFromPyJWT(t *testing.T) {
	python := "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import jwt, cryptography").CombinedOutput(); err != nil {
		t.Fatalf("python3-jwt is needed (apt-get install python3-jwt python3-cryptography; .ci/run installs them): %v\n%s", err, out)
	}
	h := newHarness(t, harnessOpts{})
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	secret := write("secret", []byte(testSecret))
	wrongSecret := write("wrong", []byte("a-different-secret-of-enough-length!"))
	rsaDER := x509.MarshalPKCS1PrivateKey(h.rsaKey)
	rsaKey := write("rsa.pem", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: rsaDER}))
	ecDER, err := x509.MarshalECPrivateKey(h.ecKey)
	if err != nil {
		t.Fatal(err)
	}
	ecKey := write("ec.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER}))

	now := time.Now().Unix()
	claims := func(edit map[string]any) string {
		c := map[string]any{"sub": "ada", "aud": "voyager", "exp": now + 3600, "roles": []string{"admin"}}
		for k, v := range edit {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		b, _ := json.Marshal(c)
		return string(b)
	}
	tests := []struct {
		name, alg, key, claims string
		status                 int
		detail                 string
	}{
		{"HS256", "HS256", secret, claims(nil), 200, ""},
		{"RS256", "RS256", rsaKey, claims(nil), 200, ""},
		{"ES256", "ES256", ecKey, claims(nil), 200, ""},
		{"aud list", "HS256", secret, claims(map[string]any{"aud": []string{"other", "voyager"}}), 200, ""},
		{"expired", "HS256", secret, claims(map[string]any{"exp": now - 60}), 401, "token refused: expired"},
		{"nbf in the future", "RS256", rsaKey, claims(map[string]any{"nbf": now + 3600}), 401, "token refused: not valid yet (nbf is in the future)"},
		{"no exp", "ES256", ecKey, claims(map[string]any{"exp": nil}), 401, "token refused: it has no exp claim; tokens must expire"},
		{"wrong aud", "HS256", secret, claims(map[string]any{"aud": "jupyterhub"}), 401, `token refused: audience must include "voyager"`},
		{"wrong secret", "HS256", wrongSecret, claims(nil), 401, "token refused: bad signature"},
		{"alg none", "none", "-", claims(nil), 401, `token refused: signing algorithm "none" is not accepted: want HS256 or RS256 or ES256`},
		{"HS512", "HS512", secret, claims(nil), 401, `token refused: signing algorithm "HS512" is not accepted: want HS256 or RS256 or ES256`},
		{"PS256", "PS256", rsaKey, claims(nil), 401, `token refused: signing algorithm "PS256" is not accepted: want HS256 or RS256 or ES256`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(python, "-c", pyMint, tc.alg, tc.key, tc.claims).CombinedOutput()
			if err != nil {
				t.Fatalf("pyjwt: %v\n%s", err, out)
			}
			tok := strings.TrimSpace(string(out))
			r := h.do("GET", "/api/v1/whoami", tok, nil)
			want(t, r, tc.status)
			if tc.status == 200 {
				who := decode[map[string]any](t, r)
				if who["subject"] != "ada" || who["admin"] != true {
					t.Errorf("whoami %v", who)
				}
				return
			}
			if p := r.problem(t); p.Detail != tc.detail {
				t.Errorf("detail %q\nwant   %q", p.Detail, tc.detail)
			}
		})
	}
	_ = http.StatusOK
}
