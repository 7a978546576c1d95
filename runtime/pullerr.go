package runtime

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// ErrRegistryUnreachable means an image could not be pulled because its
// registry could not be reached at all (its name does not resolve, or it
// refuses connections): the image may well exist, and its message says
// so. It matches ErrImageNotFound too (errors.Is), as every image that is
// absent and could not be pulled does.
var ErrRegistryUnreachable error = registryUnreachable{}

type registryUnreachable struct{}

func (registryUnreachable) Error() string { return "registry unreachable" }

func (registryUnreachable) Is(target error) bool { return target == ErrImageNotFound }

// pullError explains a failed pull of ref: a registry that cannot be
// reached is ErrRegistryUnreachable, naming the registry and what failed;
// an image the registry does not have (or that no resolver found) is
// ErrImageNotFound; anything else is wrapped as it came.
func pullError(ref string, err error) error {
	registry := ref
	if named, perr := reference.ParseNormalizedNamed(ref); perr == nil {
		registry = reference.Domain(named)
	}
	var dns *net.DNSError
	var op *net.OpError
	msg := err.Error()
	switch {
	case errors.As(err, &dns) || strings.Contains(msg, "no such host") || strings.Contains(msg, "server misbehaving"):
		return fmt.Errorf("pull image %s: %w: the registry's name %s does not resolve (is it spelt right, and does this node's DNS know it?): %w", ref, ErrRegistryUnreachable, registry, err)
	case errors.As(err, &op) || strings.Contains(msg, "connection refused") || strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "network is unreachable"):
		return fmt.Errorf("pull image %s: %w: cannot connect to registry %s: %w", ref, ErrRegistryUnreachable, registry, err)
	case errdefs.IsNotFound(err) || strings.Contains(msg, "not found"):
		return fmt.Errorf("pull image %s: %w: registry %s has no such image: %w", ref, ErrImageNotFound, registry, err)
	}
	return fmt.Errorf("pull image %s: %w", ref, err)
}
