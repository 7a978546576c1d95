package api

import (
	"fmt"

	"github.com/voyager-gpu/voyager/state"
)

// OnBehalfOfClaim names the claim in which a service that mints its own
// tokens (JupyterHub's spawner) signs the user it acts for and her
// groups: {"sub": "ada", "groups": ["vision"]}. A request that acts for
// that user (OnBehalfOfHeader) gets those groups, and so her volumes,
// profiles, group quotas and team; a service token without the claim
// acts for users with no groups, since a header alone is not signed.
const OnBehalfOfClaim = "voyager_on_behalf_of"

// delegation is a service token's signed OnBehalfOfClaim.
type delegation struct {
	user   string
	groups []string
}

// delegationOf reads claim OnBehalfOfClaim of a service token: nil when
// there is none, an error when it is malformed.
func delegationOf(claims map[string]any) (*delegation, error) {
	raw, ok := claims[OnBehalfOfClaim]
	if !ok {
		return nil, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("claim %s: want an object {\"sub\": user, \"groups\": [...]}", OnBehalfOfClaim)
	}
	sub, _ := m["sub"].(string)
	if err := state.ValidateSubject(OnBehalfOfClaim+".sub", sub); err != nil {
		return nil, fmt.Errorf("claim %s: %w", OnBehalfOfClaim, err)
	}
	d := &delegation{user: sub, groups: stringsClaim(m, "groups")}
	if g, ok := m["groups"]; ok && g != nil {
		if _, list := g.([]any); !list {
			return nil, fmt.Errorf("claim %s.groups: want a list of group names", OnBehalfOfClaim)
		}
	}
	for _, g := range d.groups {
		if err := state.ValidateSubject("group", g); err != nil {
			return nil, fmt.Errorf("claim %s.groups: %w", OnBehalfOfClaim, err)
		}
	}
	return d, nil
}

// actFor is the principal of service token pr acting for user (named in
// OnBehalfOfHeader): with the groups the token signs for her, or an error
// when the token was signed for another user.
func actFor(pr Principal, user string) (Principal, error) {
	out := Principal{Subject: user, Service: pr.Subject}
	if d := pr.delegation; d != nil {
		if d.user != user {
			return Principal{}, fmt.Errorf("the token acts for %q (its %s claim) but %s names %q; mint a token for that user", d.user, OnBehalfOfClaim, OnBehalfOfHeader, user)
		}
		out.Groups = d.groups
	}
	return out, nil
}
