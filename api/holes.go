package api

import (
	"fmt"
	"strings"

	"github.com/distribution/reference"

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
		} else if err := localRegistryCase(s.Image); err != "" {
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
