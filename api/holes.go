package api

import (
	"context"
	"fmt"
	"strings"

	"github.com/distribution/reference"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// admissionHoles finds what buildSession's checks let through and a node
// would only fail at start, or should never be asked to do: NUL bytes (no
// process argument or environment variable can carry them), image
// references that climb out of a repository or name a registry the
// operator does not allow (empty registries: any). Limits too small to
// enforce are buildSession's (VOYAGER_MIN_CPU_MILLI, whose floor is what
// CFS enforces, and VOYAGER_MIN_MEMORY_MIB).
func admissionHoles(s state.Session, registries []string) []FieldError {
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	for i, a := range s.Command {
		if strings.IndexByte(a, 0) >= 0 {
			add(fmt.Sprintf("command[%d]", i), "holds a NUL byte, which no process argument can carry; remove it")
		}
	}
	for _, k := range sortedKeys(s.Env) {
		if strings.IndexByte(s.Env[k], 0) >= 0 {
			add("env."+k, "value holds a NUL byte, which no environment variable can carry; remove it")
		}
	}
	if s.Image != "" {
		if err := imageAllowed(s.Image, registries); err != "" {
			add("image", "%s", err)
		}
	}
	return errs
}

// imageAllowed explains why ref may not run, or returns "".
func imageAllowed(ref string, registries []string) string {
	for _, seg := range strings.FieldsFunc(ref, func(r rune) bool { return r == '/' || r == ':' || r == '@' }) {
		if seg == ".." || seg == "." {
			return fmt.Sprintf("got %q, whose path has a %q segment; want an image reference such as docker.io/library/python:3.12", truncate(ref, 80), seg)
		}
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return fmt.Sprintf("got %q, which is no image reference (%v); want one such as docker.io/library/python:3.12", truncate(ref, 80), err)
	}
	if len(registries) == 0 {
		return ""
	}
	host := reference.Domain(named)
	for _, r := range registries {
		if strings.EqualFold(r, host) {
			return ""
		}
	}
	return fmt.Sprintf("registry %s is not allowed here; want an image from %s", host, strings.Join(registries, ", "))
}

// queuedLimit refuses a create that adds adding queued sessions when
// owner's queued sessions and those would exceed max (0: no limit); a job
// array adds as many as it may hold unfinished at once. It counts at admission, so two creates at the same
// instant may pass one over the limit: it bounds what one user can pile up
// in etcd, not an exact quota (quotas bound what runs).
func queuedLimit(ctx context.Context, cli *clientv3.Client, keys state.Keys, owner string, max, adding int) ([]FieldError, error) {
	if max <= 0 {
		return nil, nil
	}
	resp, err := cli.Get(ctx, keys.PendingDir(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("count queued sessions: %w", err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if q, err := state.Decode[state.QueueEntry](kv.Value); err == nil && q.Owner == owner {
			n++
		}
	}
	if n+adding > max {
		if adding > 1 {
			return []FieldError{{Field: "maxRunning", Message: fmt.Sprintf("you have %d sessions queued and this array may queue %d at once; the most allowed per user is %d: lower maxRunning to %d or less, or wait for some to start", n, adding, max, max-n)}}, nil
		}
		return []FieldError{{Field: "", Message: fmt.Sprintf("you have %d sessions queued, the most allowed per user is %d; wait for some to start, or cancel some", n, max)}}, nil
	}
	return nil, nil
}
