package nodeagent

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/voyager-gpu/voyager/state"
)

// Ports is how a part of a session uses its allocated host ports, in the
// order the placer allocates them (state.QueueEntry.Ports counts them):
// Jupyter's first for a notebook, then the Ray head's GCS, dashboard and
// client server; a Ray worker's node and object managers. A part of a
// multi-node job has MASTER_PORT (rank 0 only) and its peer ports
// (PartPorts).
type Ports struct {
	Jupyter                    int
	RayGCS, RayDash, RayClient int
	NodeManager, ObjectManager int
	Master                     int
	Peer                       []int
}

// SplitPorts names the ports of a binding for a session of kind.
func SplitPorts(kind state.SessionKind, role state.Role, ports []int) (Ports, error) {
	var p Ports
	at := func(i int) int {
		if i < len(ports) {
			return ports[i]
		}
		return 0
	}
	need := state.QueueEntry{Kind: kind}.Ports(role)
	if len(ports) < need {
		return p, fmt.Errorf("split ports: a %s %s needs %d ports, the binding has %d", kind, role, need, len(ports))
	}
	i := 0
	if kind == state.KindNotebook && role != state.RoleWorker {
		p.Jupyter = at(0)
		i = 1
	}
	switch role {
	case state.RoleHead:
		p.RayGCS, p.RayDash, p.RayClient = at(i), at(i+1), at(i+2)
	case state.RoleWorker:
		p.NodeManager, p.ObjectManager = at(0), at(1)
	}
	return p, nil
}

// jupyterScript runs JupyterLab where the image has it, else Jupyter
// Server (Debian 12 packages the jupyter_server module, used by
// jupyterhub-singleuser, but neither JupyterLab nor a jupyter-server
// command), with the arguments that follow it; failing all, `jupyter lab`
// (whose error then says what is missing; the dev busybox image's
// stand-in answers it).
const jupyterScript = `if command -v jupyter-lab >/dev/null 2>&1; then exec jupyter lab "$@"; ` +
	`elif command -v jupyter-server >/dev/null 2>&1; then exec jupyter server "$@"; ` +
	`elif python3 -c 'import jupyter_server' 2>/dev/null; then exec python3 -m jupyter_server "$@"; ` +
	`else exec jupyter lab "$@"; fi`

// JupyterArgs is the default notebook command: JupyterLab, or Jupyter
// Server in an image without it. The token is not here: it is in the
// environment as JUPYTER_TOKEN, which Jupyter reads, so that it never
// shows in the process table.
func JupyterArgs(port int) []string {
	return []string{"sh", "-c", jupyterScript, "jupyter", "--ip=0.0.0.0", "--port=" + strconv.Itoa(port), "--no-browser"}
}

// RayHeadArgs starts a Ray head in the background with the session's GPUs
// and ports. The dashboard listens on the container's loopback only, so no
// other session reaches it; its owner reaches it through the agent, which
// connects from inside the container's network (DashboardHandler).
func RayHeadArgs(p Ports, gpus int) []string {
	return []string{"ray", "start", "--head",
		"--port=" + strconv.Itoa(p.RayGCS),
		"--dashboard-host=127.0.0.1",
		"--dashboard-port=" + strconv.Itoa(p.RayDash),
		"--ray-client-server-port=" + strconv.Itoa(p.RayClient),
		"--num-gpus=" + strconv.Itoa(gpus),
	}
}

// RayWorkerArgs joins the head at headAddr:gcsPort and blocks.
func RayWorkerArgs(headAddr string, gcsPort int, p Ports, gpus int) []string {
	return []string{"ray", "start",
		"--address=" + headAddr + ":" + strconv.Itoa(gcsPort),
		"--block",
		"--num-gpus=" + strconv.Itoa(gpus),
		"--node-manager-port=" + strconv.Itoa(p.NodeManager),
		"--object-manager-port=" + strconv.Itoa(p.ObjectManager),
	}
}

// Head is where a Ray worker finds its head.
type Head struct {
	Address string
	GCSPort int
}

// Command returns the container's command for one binding of a session:
// a notebook runs Jupyter (or the session's own command, such as
// JupyterHub's singleuser server), a batch session its command; a Ray head
// runs `ray start --head` first, a Ray worker joins head and blocks. Every
// part of a multi-node job runs the job's command (JobEnv tells it its rank).
func Command(s state.Session, b state.Binding, head Head) ([]string, error) {
	if s.Gang() {
		if len(s.Command) == 0 {
			return nil, fmt.Errorf("build command of %s: a batch session needs a command", s.ID)
		}
		return s.Command, nil
	}
	p, err := SplitPorts(s.Kind, b.Role, b.Ports)
	if err != nil {
		return nil, err
	}
	gpus := len(b.GPUs)
	if b.Role == state.RoleWorker {
		if head.Address == "" || head.GCSPort == 0 {
			return nil, fmt.Errorf("build command of %s: the Ray worker has no head address", s.ID)
		}
		return RayWorkerArgs(head.Address, head.GCSPort, p, gpus), nil
	}
	main := s.Command
	switch s.Kind {
	case state.KindNotebook:
		if len(main) == 0 {
			main = JupyterArgs(p.Jupyter)
		}
	case state.KindBatch:
		if len(main) == 0 {
			return nil, fmt.Errorf("build command of %s: a batch session needs a command", s.ID)
		}
	default:
		return nil, fmt.Errorf("build command of %s: unknown kind %q", s.ID, s.Kind)
	}
	if b.Role != state.RoleHead {
		return main, nil
	}
	// The head's main command runs as "$@" of a shell that starts Ray first,
	// so the session's own arguments are never re-parsed by a shell.
	script := shellJoin(RayHeadArgs(p, gpus)) + ` && exec "$@"`
	return append([]string{"sh", "-c", script, "sh"}, main...), nil
}

// shellJoin quotes args for sh.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,") == "" {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}
