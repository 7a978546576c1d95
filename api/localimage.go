package api

import (
	"fmt"
	"strings"

	"github.com/voyager-gpu/voyager/runtime"
)

// localRegistryCase explains why ref may not run when its registry is
// Voyager's own (runtime.LocalRegistry) written in another case, or
// returns "". A registry's name is a DNS name, so VOYAGER.LOCAL is the
// same registry as voyager.local, whose images are imported and must
// never be pulled; but containerd's image names are case-sensitive, so
// such a reference would name no imported image and be pulled: asked of
// DNS and of a registry. Refused here, it never reaches a node.
func localRegistryCase(ref string) string {
	host, _, found := strings.Cut(ref, "/")
	if !found || !strings.EqualFold(host, runtime.LocalRegistry) || host == runtime.LocalRegistry {
		return ""
	}
	return fmt.Sprintf("got %q: %s is Voyager's own registry %s in other letters, whose images are imported (voyager image load), never pulled; write %s/%s",
		truncate(ref, 80), host, runtime.LocalRegistry, runtime.LocalRegistry, truncate(ref[len(host)+1:], 80))
}
