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

	"github.com/voyager-gpu/voyager/api"
)

// TestServiceTokenCarriesGroups: a service token minted by PyJWT (an
// implementation independent of the API's) that signs the user it acts
// for and her groups (api.OnBehalfOfClaim) gives her those groups, and so
// her team; without the claim she has none (the gap the claim closes); a
// token signed for another user, or with a malformed claim, is refused;
// the claim in a plain user's token changes nothing.
func TestServiceTokenCarriesGroups(t *testing.T) {
	python := "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import jwt, cryptography").CombinedOutput(); err != nil {
		t.Fatalf("python3-jwt is needed (apt-get install python3-jwt python3-cryptography; .ci/run installs them): %v\n%s", err, out)
	}
	h := newHarness(t, harnessOpts{})
	h.addNode("gpu-1", "A100", 8)
	der, err := x509.MarshalECPrivateKey(h.ecKey)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "ec.pem")
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	mint := func(claims map[string]any) string {
		t.Helper()
		c := map[string]any{"sub": "jupyterhub", "aud": "voyager", "exp": time.Now().Unix() + 600, "roles": []string{"service"}}
		for k, v := range claims {
			c[k] = v
		}
		b, _ := json.Marshal(c)
		out, err := exec.Command(python, "-c", pyMint, "ES256", key, string(b)).CombinedOutput()
		if err != nil {
			t.Fatalf("pyjwt: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	root := h.token("root", "admin")
	want(t, h.do("PUT", "/api/v1/teams/vision", root, map[string]any{"groups": []string{"cv"}}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/teams/guests", root, map[string]any{"default": true}), http.StatusOK)
	obo := func(tok, user string) []string { return []string{api.OnBehalfOfHeader, user} }

	signed := mint(map[string]any{api.OnBehalfOfClaim: map[string]any{"sub": "ada", "groups": []string{"cv", "staff"}}})
	who := decode[api.Whoami](t, want(t, h.do("GET", "/api/v1/whoami", signed, nil, obo(signed, "ada")...), http.StatusOK))
	if who.Subject != "ada" || who.Service != "jupyterhub" || strings.Join(who.Groups, ",") != "cv,staff" {
		t.Errorf("whoami with a signed delegation: %+v", who)
	}
	s := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", signed, notebook(), obo(signed, "ada")...), http.StatusCreated))
	if s.Owner != "ada" || strings.Join(s.Groups, ",") != "cv,staff" || s.Team != "vision" {
		t.Errorf("hub user's session: owner %s groups %v team %q; want ada, [cv staff], vision", s.Owner, s.Groups, s.Team)
	}

	// The header alone, as before the claim: no groups, the default team.
	plain := mint(nil)
	s = decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", plain, notebook(), obo(plain, "ada")...), http.StatusCreated))
	if len(s.Groups) != 0 || s.Team != "guests" {
		t.Errorf("without the claim: groups %v team %q; want none, guests", s.Groups, s.Team)
	}

	// Signed for ada, used for bob.
	p := want(t, h.do("POST", "/api/v1/sessions", signed, notebook(), obo(signed, "bob")...), http.StatusForbidden).problem(t)
	if !strings.Contains(p.Detail, `the token acts for "ada"`) || !strings.Contains(p.Detail, `names "bob"`) {
		t.Errorf("delegation for another user: %q", p.Detail)
	}
	for name, claim := range map[string]any{
		"not an object": "ada",
		"no sub":        map[string]any{"groups": []string{"cv"}},
		"bad group":     map[string]any{"sub": "ada", "groups": []string{"c v"}},
		"groups string": map[string]any{"sub": "ada", "groups": "cv"},
	} {
		tok := mint(map[string]any{api.OnBehalfOfClaim: claim})
		if r := h.do("GET", "/api/v1/whoami", tok, nil, obo(tok, "ada")...); r.status != http.StatusUnauthorized || !strings.Contains(r.problem(t).Detail, api.OnBehalfOfClaim) {
			t.Errorf("%s: status %d %s", name, r.status, r.body)
		}
	}
	// A user's own token cannot borrow groups through the claim.
	mallory := mint(map[string]any{"sub": "mallory", "roles": []string{}, api.OnBehalfOfClaim: map[string]any{"sub": "mallory", "groups": []string{"cv"}}})
	if who := decode[api.Whoami](t, want(t, h.do("GET", "/api/v1/whoami", mallory, nil), http.StatusOK)); len(who.Groups) != 0 {
		t.Errorf("a user token's delegation claim gave groups %v", who.Groups)
	}
}
