package nodeagent

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// HomePath is where a session's home directory is mounted.
const HomePath = "/home/jovyan"

// newToken returns a random Jupyter token: 24 bytes, hex.
func newToken() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ContainerSpec builds the container of binding b of session s with
// command args. token is the notebook's Jupyter token (empty for others).
func (a *Agent) ContainerSpec(s state.Session, b state.Binding, args []string, token string) (runtime.Spec, error) {
	cfg := a.cfg
	id := ContainerID(b)
	ports := make([]string, len(b.Ports))
	for i, p := range b.Ports {
		ports[i] = strconv.Itoa(p)
	}
	env := map[string]string{
		"HOME":            HomePath,
		"USER":            "jovyan",
		"VOYAGER_SESSION": s.ID,
		"VOYAGER_OWNER":   s.Owner,
		"VOYAGER_ROLE":    string(b.Role),
		"VOYAGER_PORTS":   strings.Join(ports, ","),
	}
	if len(b.Ports) > 0 {
		env["PORT"] = ports[0]
	}
	if token != "" {
		env["JUPYTER_TOKEN"] = token
	}
	for k, v := range s.Env {
		env[k] = v
	}
	spec := runtime.Spec{
		ID:          id,
		Image:       s.Image,
		Args:        args,
		Env:         env,
		WorkDir:     HomePath,
		UID:         cfg.UID,
		GID:         cfg.GID,
		CPUMilli:    b.CPUMilli,
		MemoryBytes: b.MemoryMiB << 20,
		PidsLimit:   cfg.PidsLimit,
		ShmBytes:    cfg.ShmMiB << 20,
		Labels: map[string]string{
			LabelNode:     cfg.Node,
			LabelSession:  s.ID,
			LabelOwner:    s.Owner,
			LabelRole:     string(b.Role),
			LabelKind:     string(s.Kind),
			LabelQueueRev: strconv.FormatInt(b.QueueRevision, 10),
		},
	}
	if spec.Image == "" {
		spec.Image = cfg.Image
	}
	if spec.Image == "" {
		return runtime.Spec{}, fmt.Errorf("build container of %s: the session names no image and the agent has no default", s.ID)
	}
	if token != "" {
		spec.Labels[LabelToken] = token
	}
	if b.MemoryMiB > 0 && b.MemoryMiB < cfg.ShmMiB {
		spec.ShmBytes = b.MemoryMiB << 20
	}
	if cfg.LogDir != "" {
		spec.LogPath = filepath.Join(cfg.LogDir, id+".log")
	}
	if cfg.HomeDir != "" {
		if err := state.ValidateSubject("owner", s.Owner); err != nil || strings.Trim(s.Owner, ".") == "" {
			return runtime.Spec{}, fmt.Errorf("build container of %s: owner %q cannot name a home directory", s.ID, s.Owner)
		}
		spec.Mounts = []runtime.Mount{{Source: filepath.Join(cfg.HomeDir, s.Owner), Target: HomePath, Create: true}}
	}
	switch cfg.GPUMode {
	case GPUModeEnv:
		spec.Env["NVIDIA_VISIBLE_DEVICES"] = "void"
		if len(b.GPUs) > 0 {
			spec.Env["NVIDIA_VISIBLE_DEVICES"] = strings.Join(b.GPUs, ",")
		}
	default:
		for _, g := range b.GPUs {
			spec.CDIDevices = append(spec.CDIDevices, cfg.CDIKind+"="+g)
		}
	}
	return spec, nil
}
