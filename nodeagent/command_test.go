package nodeagent_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

func TestCommand(t *testing.T) {
	gpus := []string{"GPU-a", "GPU-b"}
	head := nodeagent.Head{Address: "10.0.0.7", GCSPort: 40002}
	for _, tc := range []struct {
		name    string
		sess    state.Session
		b       state.Binding
		want    []string
		wantErr string
	}{
		{
			name: "notebook",
			sess: state.Session{ID: "s", Kind: state.KindNotebook},
			b:    state.Binding{Role: state.RoleSingle, Ports: []int{40001}},
			want: nodeagent.JupyterArgs(40001),
		},
		{
			name: "notebook with its own command (JupyterHub singleuser)",
			sess: state.Session{ID: "s", Kind: state.KindNotebook, Command: []string{"jupyterhub-singleuser", "--port=40001"}},
			b:    state.Binding{Role: state.RoleSingle, Ports: []int{40001}},
			want: []string{"jupyterhub-singleuser", "--port=40001"},
		},
		{
			name: "notebook Ray head",
			sess: state.Session{ID: "s", Kind: state.KindNotebook},
			b:    state.Binding{Role: state.RoleHead, GPUs: gpus, Ports: []int{40001, 40002, 40003, 40004}},
			want: []string{"sh", "-c", "ray start --head --port=40002 --dashboard-host=127.0.0.1 --dashboard-port=40003 --ray-client-server-port=40004 --num-gpus=2 && exec \"$@\"", "sh",
				"sh", "-c", `if command -v jupyter-lab >/dev/null 2>&1; then exec jupyter lab "$@"; ` +
					`elif command -v jupyter-server >/dev/null 2>&1; then exec jupyter server "$@"; ` +
					`elif python3 -c 'import jupyter_server' 2>/dev/null; then exec python3 -m jupyter_server "$@"; ` +
					`else exec jupyter lab "$@"; fi`, "jupyter",
				"--ip=0.0.0.0", "--port=40001", "--no-browser"},
		},
		{
			name: "batch Ray head keeps its arguments unparsed",
			sess: state.Session{ID: "s", Kind: state.KindBatch, Command: []string{"python", "-c", "print('a b'); import ray"}},
			b:    state.Binding{Role: state.RoleHead, Ports: []int{40010, 40011, 40012}},
			want: []string{"sh", "-c", "ray start --head --port=40010 --dashboard-host=127.0.0.1 --dashboard-port=40011 --ray-client-server-port=40012 --num-gpus=0 && exec \"$@\"", "sh",
				"python", "-c", "print('a b'); import ray"},
		},
		{
			name: "Ray worker",
			sess: state.Session{ID: "s", Kind: state.KindNotebook},
			b:    state.Binding{Role: state.RoleWorker, GPUs: gpus, Ports: []int{40020, 40021}},
			want: []string{"ray", "start", "--address=10.0.0.7:40002", "--block", "--num-gpus=2", "--node-manager-port=40020", "--object-manager-port=40021"},
		},
		{
			name: "batch",
			sess: state.Session{ID: "s", Kind: state.KindBatch, Command: []string{"python", "train.py"}},
			b:    state.Binding{Role: state.RoleSingle},
			want: []string{"python", "train.py"},
		},
		{
			name:    "batch without a command",
			sess:    state.Session{ID: "s", Kind: state.KindBatch},
			b:       state.Binding{Role: state.RoleSingle},
			wantErr: "needs a command",
		},
		{
			name:    "head short of ports",
			sess:    state.Session{ID: "s", Kind: state.KindNotebook},
			b:       state.Binding{Role: state.RoleHead, Ports: []int{40001}},
			wantErr: "needs 4 ports",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nodeagent.Command(tc.sess, tc.b, head)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v; want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Command = %q, %v\nwant %q", got, err, tc.want)
			}
		})
	}
}

func TestContainerSpecGPUModes(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		gpus    []string
		wantEnv string
		wantCDI []string
	}{
		{nodeagent.GPUModeCDI, []string{"GPU-a", "MIG-b"}, "", []string{"nvidia.com/gpu=GPU-a", "nvidia.com/gpu=MIG-b"}},
		{nodeagent.GPUModeEnv, []string{"GPU-a", "GPU-b"}, "GPU-a,GPU-b", nil},
		{nodeagent.GPUModeEnv, nil, "void", nil},
	} {
		a := nodeagent.New(nodeagent.Config{Node: node, GPUMode: tc.mode, Image: "img"})
		spec, err := a.ContainerSpec(state.Session{ID: "s", Owner: "ada", Kind: state.KindBatch},
			state.Binding{Session: "s", GPUs: tc.gpus, QueueRevision: 9, MemoryMiB: 100}, []string{"true"}, "")
		if err != nil {
			t.Fatal(err)
		}
		if spec.Env["NVIDIA_VISIBLE_DEVICES"] != tc.wantEnv || !slices.Equal(spec.CDIDevices, tc.wantCDI) {
			t.Errorf("%s %v: env %q, CDI %v", tc.mode, tc.gpus, spec.Env["NVIDIA_VISIBLE_DEVICES"], spec.CDIDevices)
		}
		if spec.ShmBytes != 100<<20 || spec.ID != "s-q9" || spec.PidsLimit != 4096 {
			t.Errorf("spec %+v: /dev/shm capped at memory, id s-q9, pids 4096", spec)
		}
	}
	a := nodeagent.New(nodeagent.Config{Node: node, Image: "img", HomeDir: "/homes"})
	for _, owner := range []string{"..", ".", "a/b"} {
		if _, err := a.ContainerSpec(state.Session{ID: "s", Owner: owner}, state.Binding{Session: "s"}, nil, ""); err == nil {
			t.Errorf("owner %q got a home directory", owner)
		}
	}
}
