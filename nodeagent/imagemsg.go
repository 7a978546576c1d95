package nodeagent

import "github.com/voyager-gpu/voyager/runtime"

// preparingImage is the reason and message of a part whose image the
// agent is making ready: an image under voyager.local is imported, never
// pulled, so it is not said to be pulling.
func preparingImage(image string) (reason, message string) {
	if runtime.IsLocalImage(image) {
		return "PreparingImage", "preparing image " + image + " (imported on this node, never pulled)"
	}
	return "Pulling", "pulling image " + image + " (if this node does not have it yet)"
}
