package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestProfileResources: a profile sets /dev/shm, ulimits and volumes for
// its sessions (what a JupyterHub user choosing it gets); a session may
// ask for more shm up to the profile's maxShmMiB, other ulimits within
// the cluster's caps, move a profile volume or add its own, and make a
// profile volume read-only but never read-write. A profile volume its
// owner may not mount refuses the session with a message naming the
// profile. Admins' profiles are checked when written.
func TestProfileResources(t *testing.T) {
	h := newHarness(t, harnessOpts{memlockKiB: 1 << 20})
	admin, ada := h.token("root", "admin"), h.token("ada")
	vision := h.sign(jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "cyd", "groups": []string{"vision"}, "aud": "voyager", "exp": time.Now().Add(time.Hour).Unix()})
	for name, v := range map[string]map[string]any{
		"pt-imagenet": {"hostPath": "/srv/imagenet", "readOnly": false, "groups": []string{"vision"}},
		"pt-scratch":  {"hostPath": "/srv/scratch"},
		"pt-results":  {"hostPath": "/srv/results/{user}", "perUser": true},
	} {
		want(t, h.do("PUT", "/api/v1/volumes/"+name, admin, v), http.StatusOK)
	}

	// Profiles are checked when written.
	for _, c := range []struct {
		name, field, msg string
		body             map[string]any
	}{
		{"shm above its cap", "shmMiB", "above the profile's maxShmMiB (1024)", map[string]any{"shmMiB": 2048, "maxShmMiB": 1024}},
		{"shm above its memory", "shmMiB", "above the profile's resources.memoryMiB (4096)", map[string]any{"shmMiB": 8192, "resources": map[string]any{"memoryMiB": 4096}}},
		{"negative cap", "maxShmMiB", "got -1", map[string]any{"maxShmMiB": -1}},
		{"memlock above the cluster's", "ulimits.memlockKiB", "at most 1048576 KiB", map[string]any{"ulimits": map[string]any{"memlockKiB": -1}}},
		{"no such volume", "volumes[0].name", `no volume "pt-nope"; define it first`, map[string]any{"volumes": []any{map[string]any{"name": "pt-nope", "mountPath": "/data"}}}},
		{"system mount path", "volumes[0].mountPath", "under the system directory /etc", map[string]any{"volumes": []any{map[string]any{"name": "pt-scratch", "mountPath": "/etc/x"}}}},
		{"overlapping mounts", "volumes[1].mountPath", "overlaps volumes[0].mountPath", map[string]any{"volumes": []any{
			map[string]any{"name": "pt-scratch", "mountPath": "/data"}, map[string]any{"name": "pt-results", "mountPath": "/data/out"}}}},
	} {
		t.Run("put/"+c.name, func(t *testing.T) {
			fieldError(t, want(t, h.do("PUT", "/api/v1/profiles/pt-bad", admin, c.body), http.StatusUnprocessableEntity).problem(t), c.field, c.msg)
		})
	}
	want(t, h.do("PUT", "/api/v1/profiles/pt-train", admin, map[string]any{
		"kind": "batch", "resources": map[string]any{"gpus": 1, "cpuMilli": 2000, "memoryMiB": 32768},
		"shmMiB": 8192, "maxShmMiB": 16384, "ulimits": map[string]any{"memlockKiB": 65536, "nofile": 8192},
		"volumes": []any{
			map[string]any{"name": "pt-scratch", "mountPath": "/scratch", "readOnly": true},
			map[string]any{"name": "pt-results", "mountPath": "/results"},
		},
	}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/profiles/pt-vision", admin, map[string]any{
		"kind": "batch", "volumes": []any{map[string]any{"name": "pt-imagenet", "mountPath": "/data"}},
	}), http.StatusOK)

	batch := func(edit func(map[string]any)) map[string]any {
		r := map[string]any{"profile": "pt-train", "command": []string{"python", "train.py"}}
		edit(r)
		return r
	}
	for _, c := range []struct {
		name    string
		token   string
		req     map[string]any
		shm     int64
		ulimits state.Ulimits
		volumes []state.VolumeMount
		field   string
		msg     string
	}{
		{name: "the profile's", token: ada, req: batch(func(map[string]any) {}), shm: 8192, ulimits: state.Ulimits{MemlockKiB: 65536, Nofile: 8192},
			volumes: []state.VolumeMount{
				{Name: "pt-scratch", MountPath: "/scratch", ReadOnly: true, HostPath: "/srv/scratch"},
				{Name: "pt-results", MountPath: "/results", HostPath: "/srv/results/ada", PerUser: true},
			}},
		{name: "more shm up to the cap, own ulimits, a volume moved and one added", token: vision, req: batch(func(r map[string]any) {
			r["shmMiB"] = 16384
			r["ulimits"] = map[string]any{"nofile": 4096}
			r["volumes"] = []any{
				map[string]any{"name": "pt-results", "mountPath": "/out", "readOnly": true},
				map[string]any{"name": "pt-imagenet", "mountPath": "/data"},
			}
		}), shm: 16384, ulimits: state.Ulimits{MemlockKiB: 65536, Nofile: 4096},
			volumes: []state.VolumeMount{
				{Name: "pt-results", MountPath: "/out", ReadOnly: true, HostPath: "/srv/results/cyd", PerUser: true},
				{Name: "pt-imagenet", MountPath: "/data", HostPath: "/srv/imagenet"},
				{Name: "pt-scratch", MountPath: "/scratch", ReadOnly: true, HostPath: "/srv/scratch"},
			}},
		{name: "a read-only profile volume stays read-only", token: ada, req: batch(func(r map[string]any) {
			r["volumes"] = []any{map[string]any{"name": "pt-scratch", "mountPath": "/scratch2"}}
		}), shm: 8192, ulimits: state.Ulimits{MemlockKiB: 65536, Nofile: 8192},
			volumes: []state.VolumeMount{
				{Name: "pt-scratch", MountPath: "/scratch2", ReadOnly: true, HostPath: "/srv/scratch"},
				{Name: "pt-results", MountPath: "/results", HostPath: "/srv/results/ada", PerUser: true},
			}},
		{name: "shm above the profile's cap", token: ada, req: batch(func(r map[string]any) { r["shmMiB"] = 16385 }),
			field: "shmMiB", msg: `above profile "pt-train"'s maxShmMiB of 16384; ask for at most 16384, leave shmMiB out for the profile's 8192 MiB`},
		{name: "less memory than the profile's shm", token: ada, req: batch(func(r map[string]any) {
			r["resources"] = map[string]any{"memoryMiB": 4096}
		}), field: "shmMiB", msg: `profile "pt-train" sets 8192 MiB, above the session's memoryMiB (4096)`},
		{name: "ulimits above the cluster's", token: ada, req: batch(func(r map[string]any) { r["ulimits"] = map[string]any{"memlockKiB": -1} }),
			field: "ulimits.memlockKiB", msg: "at most 1048576 KiB"},
		{name: "a profile volume of a group the owner is not in", token: ada, req: map[string]any{"profile": "pt-vision", "command": []string{"true"}},
			field: "profile.volumes[0].name", msg: `profile "pt-vision" mounts volume "pt-imagenet", which is not one you may mount`},
		{name: "a profile volume moved onto another", token: ada, req: batch(func(r map[string]any) {
			r["volumes"] = []any{map[string]any{"name": "pt-results", "mountPath": "/scratch/out"}}
		}), field: "profile.volumes[0].mountPath", msg: `overlaps volumes[0].mountPath "/scratch/out"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, ok := admitted(t, h, h.do("POST", "/api/v1/sessions", c.token, c.req), c.field, c.msg)
			if !ok {
				return
			}
			wantShmUlimits(t, s, c.shm, c.ulimits)
			if len(s.Volumes) != len(c.volumes) {
				t.Fatalf("stored volumes %+v; want %+v", s.Volumes, c.volumes)
			}
			for i := range c.volumes {
				if s.Volumes[i] != c.volumes[i] {
					t.Errorf("volume %d = %+v; want %+v", i, s.Volumes[i], c.volumes[i])
				}
			}
		})
	}

	// An array made from the profile: its template (every element's spec)
	// carries the same, and a profile volume its owner may not mount
	// refuses it as it refuses a session.
	a := decode[api.ArrayView](t, want(t, h.do("POST", "/api/v1/arrays", ada, batch(func(r map[string]any) {
		r["indices"] = "0-3"
		r["command"] = []string{"python", "train.py", "--seed", "{index}"}
	})), http.StatusCreated))
	if tm := a.Template; tm.ShmMiB != 8192 || len(tm.Volumes) != 2 || tm.Volumes[1].HostPath != "/srv/results/ada" || *tm.Ulimits != (state.Ulimits{MemlockKiB: 65536, Nofile: 8192}) {
		t.Errorf("array template shm %d, volumes %+v, ulimits %+v; want the profile's", tm.ShmMiB, tm.Volumes, tm.Ulimits)
	}
	fieldError(t, want(t, h.do("POST", "/api/v1/arrays", ada, map[string]any{"profile": "pt-vision", "command": []string{"true"}, "indices": "0-1"}),
		http.StatusUnprocessableEntity).problem(t), "profile.volumes[0].name", `profile "pt-vision" mounts volume "pt-imagenet"`)
}
