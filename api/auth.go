package api

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/voyager-gpu/voyager/state"
)

// AuthConfig says which tokens the API accepts and what they may do.
type AuthConfig struct {
	// HS256Secret verifies HS256 tokens. Nil: HS256 is refused.
	HS256Secret []byte
	// PublicKeys verify RS256 (RSA keys) and ES256 (P-256 keys) tokens.
	// Load them with LoadPublicKeys.
	PublicKeys []PublicKey
	// Audience, when set, must be one of the token's aud values.
	Audience string
	// Issuer, when set, must equal the token's iss.
	Issuer string
	// RolesClaim and GroupsClaim name the claims with roles and groups;
	// a dot walks into a nested object ("realm_access.roles").
	RolesClaim, GroupsClaim string
	// AdminRole may see and do everything.
	AdminRole string
	// ServiceRole may act on behalf of the user named in the
	// X-Voyager-On-Behalf-Of header, on session and profile routes only.
	ServiceRole string
	// Leeway is the clock skew allowed on exp and nbf.
	Leeway time.Duration
}

// PublicKey is one verification key with its key id (empty if none).
type PublicKey struct {
	KID string
	Key crypto.PublicKey
}

// OnBehalfOfHeader names the user a service token acts for.
const OnBehalfOfHeader = "X-Voyager-On-Behalf-Of"

// Principal is who a request acts as, after authentication.
type Principal struct {
	// Subject is the user: the token's sub, or for a service token the
	// user named in OnBehalfOfHeader.
	Subject string
	// Groups are the user's groups, from the token's groups claim.
	Groups []string
	// Admin is true for tokens with the admin role.
	Admin bool
	// Service is the service token's own subject when the request acts on
	// behalf of Subject; empty otherwise.
	Service string
	// serviceOnly marks a service token that named no user.
	serviceOnly bool
	// delegation is a service token's signed user and groups (obo.go).
	delegation *delegation
}

// authError is a refused token: status 401 (or 403) with a plain reason.
type authError struct {
	status int
	msg    string
}

// Error returns the plain reason.
func (e *authError) Error() string { return e.msg }

// verifier checks tokens against an AuthConfig.
type verifier struct {
	cfg     AuthConfig
	parser  *jwt.Parser
	methods []string
}

func newVerifier(cfg AuthConfig, now func() time.Time) (*verifier, error) {
	if cfg.RolesClaim == "" {
		cfg.RolesClaim = "roles"
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	if cfg.AdminRole == "" {
		cfg.AdminRole = "admin"
	}
	if cfg.ServiceRole == "" {
		cfg.ServiceRole = "service"
	}
	var methods []string
	if len(cfg.HS256Secret) > 0 {
		methods = append(methods, "HS256")
	}
	var rsaKeys, ecKeys bool
	for _, k := range cfg.PublicKeys {
		switch key := k.Key.(type) {
		case *rsa.PublicKey:
			rsaKeys = true
		case *ecdsa.PublicKey:
			if key.Curve != elliptic.P256() {
				return nil, fmt.Errorf("load public key %q: only P-256 EC keys (ES256) are supported", k.KID)
			}
			ecKeys = true
		default:
			return nil, fmt.Errorf("load public key %q: unsupported key type %T: want RSA or EC P-256", k.KID, k.Key)
		}
	}
	if rsaKeys {
		methods = append(methods, "RS256")
	}
	if ecKeys {
		methods = append(methods, "ES256")
	}
	if len(methods) == 0 {
		return nil, errors.New("configure token verification: set an HS256 secret or public keys (VOYAGER_JWT_SECRET or VOYAGER_JWT_PUBLIC_KEYS)")
	}
	v := &verifier{cfg: cfg, methods: methods}
	// WithValidMethods refuses "none" and any algorithm not configured.
	opts := append(v.options(), jwt.WithTimeFunc(now))
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// keyFor returns the keys that may verify t: the secret for HS256 only,
// RSA keys for RS256 only, EC keys for ES256 only, so a public key can
// never serve as an HMAC secret.
func (v *verifier) keyFor(t *jwt.Token) (any, error) {
	alg, _ := t.Header["alg"].(string)
	if alg == "HS256" {
		return v.cfg.HS256Secret, nil
	}
	kid, _ := t.Header["kid"].(string)
	var set jwt.VerificationKeySet
	for _, k := range v.cfg.PublicKeys {
		if kid != "" && k.KID != "" && k.KID != kid {
			continue
		}
		switch k.Key.(type) {
		case *rsa.PublicKey:
			if alg == "RS256" {
				set.Keys = append(set.Keys, k.Key)
			}
		case *ecdsa.PublicKey:
			if alg == "ES256" {
				set.Keys = append(set.Keys, k.Key)
			}
		}
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("no key with kid %q for %s", kid, alg)
	}
	return set, nil
}

// verify checks a raw token and returns its principal (before any
// on-behalf-of substitution).
func (v *verifier) verify(raw string) (Principal, error) {
	claims := jwt.MapClaims{}
	_, err := v.parser.ParseWithClaims(raw, claims, v.keyFor)
	if err != nil {
		return Principal{}, &authError{status: 401, msg: v.explain(err, raw)}
	}
	sub, _ := claims["sub"].(string)
	if err := state.ValidateSubject("sub claim", sub); err != nil {
		return Principal{}, &authError{status: 401, msg: "token refused: " + err.Error()}
	}
	roles := stringsClaim(claims, v.cfg.RolesClaim)
	pr := Principal{Subject: sub, Groups: stringsClaim(claims, v.cfg.GroupsClaim)}
	for _, r := range roles {
		switch r {
		case v.cfg.AdminRole:
			pr.Admin = true
		case v.cfg.ServiceRole:
			pr.serviceOnly = true
		}
	}
	if pr.Admin {
		pr.serviceOnly = false
	}
	if pr.serviceOnly {
		if pr.delegation, err = delegationOf(claims); err != nil {
			return Principal{}, &authError{status: 401, msg: "token refused: " + err.Error()}
		}
	}
	for _, g := range pr.Groups {
		if state.ValidateSubject("group", g) != nil {
			return Principal{}, &authError{status: 401, msg: fmt.Sprintf("token refused: group %q in claim %s: want 1-128 letters, digits, '@', '.', '_', '+' or '-'", g, v.cfg.GroupsClaim)}
		}
	}
	return pr, nil
}

func (v *verifier) options() []jwt.ParserOption {
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(v.methods),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(v.cfg.Leeway),
	}
	if v.cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(v.cfg.Audience))
	}
	if v.cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(v.cfg.Issuer))
	}
	return opts
}

// explain turns a jwt error into a plain reason for the 401's detail.
func (v *verifier) explain(err error, raw string) string {
	alg := headerAlg(raw)
	if alg != "" && !contains(v.methods, alg) {
		return fmt.Sprintf("token refused: signing algorithm %q is not accepted: want %s", alg, strings.Join(v.methods, " or "))
	}
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "token refused: malformed: want a JWT of three base64url parts (header.claims.signature)"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "token refused: bad signature"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "token refused: no key verifies it (unknown kid?)"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "token refused: it has no exp claim; tokens must expire"
	case errors.Is(err, jwt.ErrTokenExpired):
		return "token refused: expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "token refused: not valid yet (nbf is in the future)"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return fmt.Sprintf("token refused: audience must include %q", v.cfg.Audience)
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return fmt.Sprintf("token refused: issuer must be %q", v.cfg.Issuer)
	}
	return "token refused: " + err.Error()
}

func headerAlg(raw string) string {
	h, _, ok := strings.Cut(raw, ".")
	if !ok {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		return ""
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(b, &hdr) != nil {
		return ""
	}
	return hdr.Alg
}

// stringsClaim reads a list-of-strings claim at a dotted path; a string
// value is split on spaces and commas.
func stringsClaim(claims map[string]any, path string) []string {
	var cur any = claims
	for _, part := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[part]
	}
	switch v := cur.(type) {
	case string:
		return strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == ',' })
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// LoadPublicKeys reads verification keys from a PEM file (PUBLIC KEY,
// RSA PUBLIC KEY or CERTIFICATE blocks) or a JWKS file (a JSON object with
// "keys": RSA and EC P-256 entries).
func LoadPublicKeys(path string) ([]PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read public keys: %w", err)
	}
	if strings.HasPrefix(strings.TrimSpace(string(b)), "{") {
		return parseJWKS(b)
	}
	return parsePEMKeys(b)
}

func parsePEMKeys(b []byte) ([]PublicKey, error) {
	var out []PublicKey
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		var key any
		var err error
		switch blk.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(blk.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(blk.Bytes)
		case "CERTIFICATE":
			var c *x509.Certificate
			if c, err = x509.ParseCertificate(blk.Bytes); err == nil {
				key = c.PublicKey
			}
		default:
			return nil, fmt.Errorf("parse public keys: PEM block %q: want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE", blk.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("parse public keys: %w", err)
		}
		out = append(out, PublicKey{Key: key})
	}
	if len(out) == 0 {
		return nil, errors.New("parse public keys: no PEM block found: want PEM public keys or a JWKS JSON document")
	}
	return out, nil
}

type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

func parseJWKS(b []byte) ([]PublicKey, error) {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("parse JWKS: %w", err)
	}
	var out []PublicKey
	for _, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		big64 := func(s string) (*big.Int, error) {
			raw, err := base64.RawURLEncoding.DecodeString(s)
			if err != nil {
				return nil, fmt.Errorf("parse JWKS key %q: %w", k.Kid, err)
			}
			return new(big.Int).SetBytes(raw), nil
		}
		switch k.Kty {
		case "RSA":
			n, err := big64(k.N)
			if err != nil {
				return nil, err
			}
			e, err := big64(k.E)
			if err != nil {
				return nil, err
			}
			out = append(out, PublicKey{KID: k.Kid, Key: &rsa.PublicKey{N: n, E: int(e.Int64())}})
		case "EC":
			if k.Crv != "P-256" {
				return nil, fmt.Errorf("parse JWKS key %q: curve %q: want P-256", k.Kid, k.Crv)
			}
			x, errX := base64.RawURLEncoding.DecodeString(k.X)
			y, errY := base64.RawURLEncoding.DecodeString(k.Y)
			if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
				return nil, fmt.Errorf("parse JWKS key %q: x and y must be 32-byte base64url values", k.Kid)
			}
			key, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
			if err != nil {
				return nil, fmt.Errorf("parse JWKS key %q: %w", k.Kid, err)
			}
			out = append(out, PublicKey{KID: k.Kid, Key: key})
		default:
			return nil, fmt.Errorf("parse JWKS key %q: kty %q: want RSA or EC", k.Kid, k.Kty)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("parse JWKS: no signing keys")
	}
	return out, nil
}

// TokenClaims describe a token to mint.
type TokenClaims struct {
	Subject       string
	Roles, Groups []string
	TTL           time.Duration
	Audience      string // empty: no aud claim
	Issuer        string // empty: no iss claim
	// RolesClaim and GroupsClaim name the claims (dots nest objects), as
	// AuthConfig does; empty means "roles" and "groups".
	RolesClaim, GroupsClaim string
}

// MintHS256 signs a token with an HS256 secret: what `voyager token` and
// tests use. It expires after c.TTL and is valid from now.
func MintHS256(secret []byte, c TokenClaims, now time.Time) (string, error) {
	claims := jwt.MapClaims{
		"sub": c.Subject,
		"iat": now.Unix(),
		"nbf": now.Unix(),
		"exp": now.Add(c.TTL).Unix(),
	}
	setPath := func(path string, v []string) {
		if len(v) == 0 {
			return
		}
		parts := strings.Split(path, ".")
		m := map[string]any(claims)
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = v
	}
	rc, gc := c.RolesClaim, c.GroupsClaim
	if rc == "" {
		rc = "roles"
	}
	if gc == "" {
		gc = "groups"
	}
	setPath(rc, c.Roles)
	setPath(gc, c.Groups)
	if c.Audience != "" {
		claims["aud"] = c.Audience
	}
	if c.Issuer != "" {
		claims["iss"] = c.Issuer
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}
