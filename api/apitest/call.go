package apitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Do sends one request to the API: method on url, body encoded as JSON
// (nil: no body), token as its bearer ("": none). It returns the answer's
// status and body; a request that gets no answer fails tb.
func Do(tb testing.TB, method, url, token string, body any) (int, []byte) {
	tb.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			tb.Fatalf("%s %s: encode the body: %v", method, url, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read the answer: %v", method, url, err)
	}
	return resp.StatusCode, b
}

// Call is Do that fails tb unless the answer's status is want, and decodes
// the answer into out (nil: not decoded). It returns the answer's body.
func Call(tb testing.TB, method, url, token string, body, out any, want int) []byte {
	tb.Helper()
	code, b := Do(tb, method, url, token, body)
	if err := expect(code, b, out, want); err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	return b
}

// expect says what is wrong with an answer of status code and body b
// where the status want was expected, and decodes b into out (nil: not
// decoded).
func expect(code int, b []byte, out any, want int) error {
	if code != want {
		return fmt.Errorf("%d, want %d: %s", code, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode the answer: %w: %s", err, b)
		}
	}
	return nil
}

// Token signs, with the HS256 secret, a token for sub with roles that is
// valid for an hour: what the API's default claims (sub, roles) accept.
func Token(tb testing.TB, secret []byte, sub string, roles ...string) string {
	tb.Helper()
	claims := jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()}
	if len(roles) > 0 {
		claims["roles"] = roles
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
	if err != nil {
		tb.Fatalf("sign a token for %s: %v", sub, err)
	}
	return s
}
