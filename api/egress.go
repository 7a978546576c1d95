package api

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/voyager-gpu/voyager/state"
)

// maxEgressAllow bounds the networks one egress rule lists: each is a
// firewall rule on every node the session runs on.
const maxEgressAllow = 32

// validateEgress checks an egress rule of a request or a profile at field.
func validateEgress(field string, e *state.Egress, add func(field, format string, args ...any)) {
	if e == nil {
		return
	}
	if !e.Deny && len(e.Allow) > 0 {
		add(field+".allow", `lists networks but egress is not denied, so every network is reachable already; set "deny": true to limit egress to these`)
	}
	if len(e.Allow) > maxEgressAllow {
		add(field+".allow", "has %d networks, want at most %d", len(e.Allow), maxEgressAllow)
		return
	}
	for i, c := range e.Allow {
		p, err := netip.ParsePrefix(c)
		switch {
		case err != nil || !p.Addr().Is4():
			add(field+".allow["+itoa(i)+"]", `got %q, want an IPv4 network in CIDR form such as "10.20.0.0/16" or "192.0.2.7/32"`, truncate(c, 60))
		case p.Masked() != p:
			add(field+".allow["+itoa(i)+"]", "got %q, which has host bits set; want %q", c, p.Masked().String())
		}
	}
}

// mergeEgress is the egress of a session asked with req over profile
// prof: a profile that denies egress binds its sessions (an owner may
// narrow its Allow, never widen it, nor lift the denial); otherwise the
// owner's own rule, if any.
func mergeEgress(prof *state.Profile, req *state.Egress, add func(field, format string, args ...any)) *state.Egress {
	validateEgress("egress", req, add)
	var pe *state.Egress
	if prof != nil && prof.Egress != nil && prof.Egress.Deny {
		pe = prof.Egress
	}
	switch {
	case pe == nil && (req == nil || !req.Deny):
		return nil
	case pe == nil:
		return &state.Egress{Deny: true, Allow: slices.Clone(req.Allow)}
	case req == nil:
		return &state.Egress{Deny: true, Allow: slices.Clone(pe.Allow)}
	case !req.Deny:
		add("egress.deny", "profile %q denies egress and its sessions cannot lift that; leave egress out, or ask for deny with a subset of the profile's networks (%s)", prof.Name, listOrNone(pe.Allow))
		return nil
	}
	for i, c := range req.Allow {
		if !covered(c, pe.Allow) {
			add("egress.allow["+itoa(i)+"]", "network %s is not among those profile %q allows (%s); ask an admin, or leave it out", c, prof.Name, listOrNone(pe.Allow))
		}
	}
	return &state.Egress{Deny: true, Allow: slices.Clone(req.Allow)}
}

// covered reports whether network c lies inside one of nets.
func covered(c string, nets []string) bool {
	p, err := netip.ParsePrefix(c)
	if err != nil {
		return false
	}
	for _, n := range nets {
		q, err := netip.ParsePrefix(n)
		if err == nil && q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func listOrNone(nets []string) string {
	if len(nets) == 0 {
		return "none"
	}
	return strings.Join(nets, ", ")
}
