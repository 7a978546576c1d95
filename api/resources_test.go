package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// fieldError fails unless p names field with a message containing text.
func fieldError(t *testing.T, p api.Problem, field, text string) {
	t.Helper()
	for _, e := range p.Errors {
		if e.Field == field && strings.Contains(e.Message, text) {
			return
		}
	}
	t.Errorf("errors %+v; want %s: …%s…", p.Errors, field, text)
}

// admitted checks the answer to a create: with field set, a refusal
// naming field with msg (false); else the created session's stored spec.
func admitted(t *testing.T, h *harness, resp response, field, msg string) (state.Session, bool) {
	t.Helper()
	if field != "" {
		fieldError(t, want(t, resp, http.StatusUnprocessableEntity).problem(t), field, msg)
		return state.Session{}, false
	}
	v := decode[api.SessionView](t, want(t, resp, http.StatusCreated))
	stored, _, err := state.Get[state.Session](context.Background(), h.cli, h.keys.Session(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	return stored, true
}

// wantShmUlimits fails unless s has /dev/shm shm and ulimits u.
func wantShmUlimits(t *testing.T, s state.Session, shm int64, u state.Ulimits) {
	t.Helper()
	if s.ShmMiB != shm || s.Ulimits == nil || *s.Ulimits != u {
		t.Errorf("stored shm %d, ulimits %+v; want %d, %+v", s.ShmMiB, s.Ulimits, shm, u)
	}
}

// TestShmAndUlimitsAtAdmission: a session's /dev/shm defaults to the
// cluster's size capped at half its memory, may be asked for up to its
// memory and no more (tmpfs pages count against the memory limit); its
// ulimits default to the cluster's and may be asked for within them.
func TestShmAndUlimitsAtAdmission(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	create := func(edit func(map[string]any)) response {
		r := notebook()
		edit(r)
		return h.do("POST", "/api/v1/sessions", ada, r)
	}
	for _, c := range []struct {
		name       string
		edit       func(map[string]any)
		shm        int64
		ulimits    state.Ulimits
		field, msg string
	}{
		{name: "defaults", edit: func(map[string]any) {}, shm: 8192, ulimits: state.Ulimits{MemlockKiB: -1, Nofile: 1 << 20}},
		{name: "default capped at half the memory", edit: func(r map[string]any) {
			r["resources"] = map[string]any{"cpuMilli": 1000, "memoryMiB": 4096}
		}, shm: 2048, ulimits: state.Ulimits{MemlockKiB: -1, Nofile: 1 << 20}},
		{name: "asked up to the memory", edit: func(r map[string]any) {
			r["shmMiB"] = 16384
			r["ulimits"] = map[string]any{"nofile": 4096, "memlockKiB": 65536}
		}, shm: 16384, ulimits: state.Ulimits{MemlockKiB: 65536, Nofile: 4096}},
		{name: "only nofile asked", edit: func(r map[string]any) { r["ulimits"] = map[string]any{"nofile": 65536} },
			shm: 8192, ulimits: state.Ulimits{MemlockKiB: -1, Nofile: 65536}},
		{name: "shm above the memory", edit: func(r map[string]any) { r["shmMiB"] = 16385 },
			field: "shmMiB", msg: "above the session's memoryMiB (16384)"},
		{name: "shm above a Ray worker's memory", edit: func(r map[string]any) {
			r["shmMiB"] = 9000
			r["ray"] = map[string]any{"workers": 1, "workerResources": map[string]any{"cpuMilli": 1000, "memoryMiB": 8192}}
		}, field: "shmMiB", msg: "memoryMiB (8192)"},
		{name: "negative shm", edit: func(r map[string]any) { r["shmMiB"] = -1 }, field: "shmMiB", msg: "got -1"},
		{name: "nofile above the cluster's", edit: func(r map[string]any) { r["ulimits"] = map[string]any{"nofile": 1<<20 + 1} },
			field: "ulimits.nofile", msg: "VOYAGER_ULIMIT_NOFILE"},
		{name: "nofile too small", edit: func(r map[string]any) { r["ulimits"] = map[string]any{"nofile": 10} },
			field: "ulimits.nofile", msg: "at least 64"},
		{name: "memlock below unlimited", edit: func(r map[string]any) { r["ulimits"] = map[string]any{"memlockKiB": -2} },
			field: "ulimits.memlockKiB", msg: "got -2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if stored, ok := admitted(t, h, create(c.edit), c.field, c.msg); ok {
				wantShmUlimits(t, stored, c.shm, c.ulimits)
			}
		})
	}

	// A cluster with a finite memlock refuses unlimited and more.
	capped := newHarness(t, harnessOpts{memlockKiB: 1024})
	for _, m := range []int64{-1, 1025} {
		r := notebook()
		r["ulimits"] = map[string]any{"memlockKiB": m}
		fieldError(t, want(t, capped.do("POST", "/api/v1/sessions", capped.token("ada"), r), http.StatusUnprocessableEntity).problem(t),
			"ulimits.memlockKiB", "at most 1024 KiB")
	}
	v := decode[api.SessionView](t, want(t, capped.do("POST", "/api/v1/sessions", capped.token("ada"), notebook()), http.StatusCreated))
	if v.Ulimits == nil || v.Ulimits.MemlockKiB != 1024 {
		t.Errorf("default memlock under a 1024 KiB cap: %+v", v.Ulimits)
	}
}

// TestVolumes: admins define volumes (validated); users see and mount only
// those allowed to them or their groups; a create resolves each into the
// spec (a per-user volume to the owner's own directory, a read-only one
// read-only whatever was asked), and refuses unknown or forbidden volumes
// and mount paths that would hide system directories or the home.
func TestVolumes(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	admin, ada, bob := h.token("root", "admin"), h.token("ada"), h.token("bob")
	vision := h.sign(jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "cyd", "groups": []string{"vision"}, "aud": "voyager", "exp": time.Now().Add(time.Hour).Unix()})

	for _, c := range []struct {
		name  string
		body  map[string]any
		field string
		msg   string
	}{
		{"relative path", map[string]any{"hostPath": "srv/data"}, "hostPath", "clean absolute directory"},
		{"root", map[string]any{"hostPath": "/"}, "hostPath", "other than /"},
		{"unclean", map[string]any{"hostPath": "/srv/../etc"}, "hostPath", "clean absolute"},
		{"per-user without {user}", map[string]any{"hostPath": "/srv/results", "perUser": true}, "hostPath", "{user} once"},
		{"{user} at the top", map[string]any{"hostPath": "/{user}", "perUser": true}, "hostPath", "below a directory of its own"},
		{"{user} inside a segment", map[string]any{"hostPath": "/srv/r-{user}", "perUser": true}, "hostPath", "whole path segment"},
		{"{user} without per-user", map[string]any{"hostPath": "/srv/{user}"}, "hostPath", "perUser is false"},
		{"bad user name", map[string]any{"hostPath": "/srv/d", "users": []string{"a b"}}, "users", "invalid user"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fieldError(t, want(t, h.do("PUT", "/api/v1/volumes/rs-bad", admin, c.body), http.StatusUnprocessableEntity).problem(t), c.field, c.msg)
		})
	}
	want(t, h.do("PUT", "/api/v1/volumes/rs-data", ada, map[string]any{"hostPath": "/srv/data"}), http.StatusForbidden)
	want(t, h.do("PUT", "/api/v1/volumes/rs-data", admin, map[string]any{"hostPath": "/srv/datasets", "readOnly": true, "groups": []string{"vision"}}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/volumes/rs-results", admin, map[string]any{"hostPath": "/srv/results/{user}", "perUser": true}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/volumes/rs-ada", admin, map[string]any{"hostPath": "/srv/ada", "users": []string{"ada"}}), http.StatusOK)

	names := func(tok string) string {
		var out []string
		for _, v := range decode[api.VolumeList](t, want(t, h.do("GET", "/api/v1/volumes", tok, nil), http.StatusOK)).Items {
			out = append(out, v.Name)
		}
		return strings.Join(out, ",")
	}
	for tok, w := range map[string]string{admin: "rs-ada,rs-data,rs-results", ada: "rs-ada,rs-results", bob: "rs-results", vision: "rs-data,rs-results"} {
		if got := names(tok); got != w {
			t.Errorf("volume list %q; want %q", got, w)
		}
	}
	want(t, h.do("GET", "/api/v1/volumes/rs-data", ada, nil), http.StatusNotFound)
	if v := decode[state.Volume](t, want(t, h.do("GET", "/api/v1/volumes/rs-data", vision, nil), http.StatusOK)); v.By != "root" || !v.ReadOnly {
		t.Errorf("volume %+v", v)
	}

	withVolumes := func(vs ...map[string]any) map[string]any {
		r := notebook()
		r["volumes"] = vs
		return r
	}
	vol := func(name, at string, ro bool) map[string]any {
		return map[string]any{"name": name, "mountPath": at, "readOnly": ro}
	}
	// Resolved into the spec as stored.
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", vision,
		withVolumes(vol("rs-data", "/data", false), vol("rs-results", "/home/jovyan/results", false))), http.StatusCreated))
	stored, _, err := state.Get[state.Session](context.Background(), h.cli, h.keys.Session(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	wantVols := []state.VolumeMount{
		{Name: "rs-data", MountPath: "/data", ReadOnly: true, HostPath: "/srv/datasets"},
		{Name: "rs-results", MountPath: "/home/jovyan/results", HostPath: "/srv/results/cyd", PerUser: true},
	}
	if len(stored.Volumes) != 2 || stored.Volumes[0] != wantVols[0] || stored.Volumes[1] != wantVols[1] {
		t.Errorf("stored volumes %+v; want %+v", stored.Volumes, wantVols)
	}
	v = decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, withVolumes(vol("rs-results", "/results", true))), http.StatusCreated))
	if len(v.Volumes) != 1 || v.Volumes[0].HostPath != "/srv/results/ada" || !v.Volumes[0].ReadOnly {
		t.Errorf("ada's volumes %+v; want her own directory, read-only as asked", v.Volumes)
	}

	for _, c := range []struct {
		name  string
		tok   string
		vols  []map[string]any
		field string
		msg   string
	}{
		{"unknown", ada, []map[string]any{vol("rs-none", "/data", false)}, "volumes[0].name", `no volume "rs-none"`},
		{"not allowed", ada, []map[string]any{vol("rs-data", "/data", false)}, "volumes[0].name", `no volume "rs-data"`},
		{"another user's", bob, []map[string]any{vol("rs-ada", "/data", false)}, "volumes[0].name", `no volume "rs-ada"`},
		{"relative mount path", ada, []map[string]any{vol("rs-results", "data", false)}, "volumes[0].mountPath", "clean absolute path"},
		{"under /proc", ada, []map[string]any{vol("rs-results", "/proc/x", false)}, "volumes[0].mountPath", "system directory /proc"},
		{"over /dev", ada, []map[string]any{vol("rs-results", "/dev", false)}, "volumes[0].mountPath", "system directory /dev"},
		{"over the home", ada, []map[string]any{vol("rs-results", "/home/jovyan", false)}, "volumes[0].mountPath", "its home"},
		{"over the root", ada, []map[string]any{vol("rs-results", "/", false)}, "volumes[0].mountPath", "its home"},
		{"twice", ada, []map[string]any{vol("rs-results", "/a", false), vol("rs-results", "/b", false)}, "volumes[1].name", "twice"},
		{"nested", ada, []map[string]any{vol("rs-results", "/a", false), vol("rs-ada", "/a/b", false)}, "volumes[1].mountPath", "overlaps"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := h.countKeys(h.keys.Sessions())
			fieldError(t, want(t, h.do("POST", "/api/v1/sessions", c.tok, withVolumes(c.vols...)), http.StatusUnprocessableEntity).problem(t), c.field, c.msg)
			if after := h.countKeys(h.keys.Sessions()); after != before {
				t.Errorf("a refused create wrote a session: %d → %d", before, after)
			}
		})
	}

	want(t, h.do("DELETE", "/api/v1/volumes/rs-ada", ada, nil), http.StatusForbidden)
	want(t, h.do("DELETE", "/api/v1/volumes/rs-ada", admin, nil), http.StatusNoContent)
	want(t, h.do("DELETE", "/api/v1/volumes/rs-ada", admin, nil), http.StatusNotFound)
	fieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, withVolumes(vol("rs-ada", "/data", false))), http.StatusUnprocessableEntity).problem(t),
		"volumes[0].name", `no volume "rs-ada"`)
}
