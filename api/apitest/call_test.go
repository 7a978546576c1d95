package apitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// echo answers 201 with what it was sent: the method, the bearer, the
// content type and the body.
func echo(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"method": r.Method, "auth": r.Header.Get("Authorization"),
			"type": r.Header.Get("Content-Type"), "body": string(b)})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestDoSendsJSONWithTheBearer(t *testing.T) {
	srv := echo(t)
	for _, tc := range []struct {
		name, token string
		body        any
		want        map[string]string
	}{
		{"body and token", "tok", map[string]int{"gpus": 2}, map[string]string{"method": "POST", "auth": "Bearer tok", "type": "application/json", "body": `{"gpus":2}`}},
		{"neither", "", nil, map[string]string{"method": "POST", "auth": "", "type": "", "body": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b := Do(t, "POST", srv.URL+"/x", tc.token, tc.body)
			var got map[string]string
			if err := json.Unmarshal(b, &got); err != nil || code != http.StatusCreated {
				t.Fatalf("answer %d %s (%v)", code, b, err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("the server saw %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCallDecodesTheWantedStatus(t *testing.T) {
	srv := echo(t)
	var out map[string]string
	Call(t, "PUT", srv.URL+"/x", "tok", nil, &out, http.StatusCreated)
	if out["method"] != "PUT" || out["auth"] != "Bearer tok" {
		t.Errorf("decoded %v, want the echo of PUT with the bearer", out)
	}
}

// TestExpect: what Call fails a test with: another status than wanted,
// or an answer that does not decode into out.
func TestExpect(t *testing.T) {
	var out struct{ N int }
	for _, tc := range []struct {
		name, body, err string
		code            int
		out             any
	}{
		{"wanted, decoded", `{"N":3}`, "", 200, &out},
		{"wanted, not decoded", `not json`, "", 200, nil},
		{"another status", `{"detail":"no"}`, `201, want 200: {"detail":"no"}`, 201, &out},
		{"undecodable", `not json`, "decode the answer", 200, &out},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := expect(tc.code, []byte(tc.body), tc.out, 200)
			if (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("expect = %v, want an error saying %q (none if empty)", err, tc.err)
			}
		})
	}
	if out.N != 3 {
		t.Errorf("decoded %+v, want N 3", out)
	}
}

// TestTokenCarriesSubjectAndRoles: Token's token verifies with its secret
// only, and carries the subject, the roles (none: no roles claim) and an
// expiry within the hour.
func TestTokenCarriesSubjectAndRoles(t *testing.T) {
	secret := []byte("apitest-token-secret-0123456789")
	parse := func(tok string, key []byte) (jwt.MapClaims, error) {
		claims := jwt.MapClaims{}
		_, err := jwt.ParseWithClaims(tok, claims, func(*jwt.Token) (any, error) { return key, nil }, jwt.WithValidMethods([]string{"HS256"}))
		return claims, err
	}
	c, err := parse(Token(t, secret, "ada", "admin"), secret)
	if err != nil || c["sub"] != "ada" || fmt.Sprint(c["roles"]) != "[admin]" {
		t.Fatalf("claims %v (%v); want sub ada, roles [admin]", c, err)
	}
	if exp, err := c.GetExpirationTime(); err != nil || time.Until(exp.Time) > time.Hour || time.Until(exp.Time) < 50*time.Minute {
		t.Errorf("expiry %v (%v); want about an hour from now", exp, err)
	}
	if c, err := parse(Token(t, secret, "bob"), secret); err != nil || c["roles"] != nil {
		t.Errorf("claims %v (%v); want no roles claim", c, err)
	}
	if _, err := parse(Token(t, secret, "ada"), []byte("another-secret-0123456789abcdef")); err == nil {
		t.Error("a token verified with another secret")
	}
}
