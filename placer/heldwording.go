package placer

import "fmt"

// reservedMessage is the shortfall of part p on node n, held for another
// request (anti-starvation, hold.go): what that request asks for, and, to
// a request for no GPUs (a CPU job, which its owner would expect to fit
// beside a GPU request), plainly that a held node takes nothing else, not
// even a request without GPUs, until the request it is held for starts
// (issue 37).
func reservedMessage(p *part, n *nodeState) string {
	msg := "node " + n.name + " is held for another waiting request"
	if n.reservedFor == reserveMark {
		msg = "node " + n.name + " is kept for whole-machine " + n.reservedWhat
	} else if n.reservedWhat != "" {
		msg += " (" + n.reservedWhat + ")"
	}
	if p.req.GPUs == 0 && p.req.GPUShareMiB == 0 {
		if n.reservedFor == reserveMark {
			return msg + "; nothing else is placed there, not even a request for no GPUs like this one"
		}
		msg = fmt.Sprintf("%s; until it starts nothing else is placed on %s, not even a request for no GPUs like this one", msg, n.name)
	}
	return msg
}
