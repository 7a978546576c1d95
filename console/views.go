package console

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// view renders a page's data as an HTML fragment, calling the API as the
// viewer. X-Voyager-API-Calls says how many API calls it took.
func (c *Console) view(ctx *gin.Context) {
	k := c.caller(ctx)
	var (
		data any
		err  error
	)
	switch page := ctx.Param("page"); page {
	case "cluster":
		data, err = c.clusterView(k)
	case "queue":
		data, err = c.queueView(k)
	case "sessions":
		data, err = c.sessionsView(k)
	case "history":
		data, err = c.historyView(k)
	case "admin":
		data, err = c.adminView(k)
	default:
		ctx.Data(http.StatusNotFound, "text/plain; charset=utf-8", []byte(fmt.Sprintf("no console view %q", page)))
		return
	}
	if err != nil {
		c.fail(ctx, k, err)
		return
	}
	ctx.Header("X-Voyager-API-Calls", fmt.Sprint(k.calls))
	c.render(ctx, http.StatusOK, "view-"+ctx.Param("page"), data)
}

// modelCount is a number of GPUs of one model.
type modelCount struct {
	Model string
	N     int
}

// clusterView is the cluster page's data.
type clusterView struct {
	Nodes                      []api.NodeSummary
	Free                       []modelCount
	Total, Used, FreeN, Unused int
	Cordoned, Draining         int
	// PowerDown counts the nodes empty long enough to power down.
	PowerDown int
}

func (c *Console) clusterView(k *caller) (clusterView, error) {
	var nl api.NodeList
	if err := k.call("GET", "/api/v1/nodes?devices=true", nil, &nl); err != nil {
		return clusterView{}, err
	}
	v := clusterView{Nodes: nl.Items, Free: freeByModel(nl.Items)}
	for _, n := range nl.Items {
		v.Total += n.GPUs.Total
		v.Used += n.GPUs.Used
		v.FreeN += n.GPUs.Free
		v.Unused += n.GPUs.Unused
		if n.PowerDown {
			v.PowerDown++
		}
		if n.Cordon != nil {
			if n.Cordon.Drain {
				v.Draining++
			} else {
				v.Cordoned++
			}
		}
	}
	return v, nil
}

// freeByModel counts the free healthy devices of uncordoned nodes by model
// (with the MIG profile, for MIG devices). Without device detail it
// counts from each node's models when the node has one model.
func freeByModel(nodes []api.NodeSummary) []modelCount {
	m := map[string]int{}
	for _, n := range nodes {
		if n.Cordon != nil {
			continue
		}
		if n.Devices == nil {
			if len(n.Models) == 1 && n.GPUs.Free > 0 {
				for model := range n.Models {
					m[model] += n.GPUs.Free
				}
			}
			continue
		}
		for _, d := range n.Devices {
			if d.Shared {
				continue // never free whole: its fractions are the start form's device choices
			}
			if d.Healthy && d.Owner == "" {
				name := d.Model
				if d.MIGProfile != "" {
					name += " MIG " + d.MIGProfile
				}
				m[name]++
			}
		}
	}
	out := make([]modelCount, 0, len(m))
	for model, n := range m {
		out = append(out, modelCount{model, n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

type queueView struct {
	api.QueueView
}

func (c *Console) queueView(k *caller) (queueView, error) {
	var v queueView
	err := k.call("GET", "/api/v1/queue", nil, &v.QueueView)
	return v, err
}

// sessionsView is the "My sessions" page: the viewer's live sessions, the
// start form's profiles and free GPUs.
type sessionsView struct {
	Me       api.Whoami
	Active   []api.SessionView
	Finished int
	Profiles []state.Profile
	Free     []modelCount
	// Whole is Free's whole GPUs (the gpuModel select); Devices the MIG
	// devices and shared GPUs to choose from (devices.go).
	Whole   []modelCount
	Devices []deviceChoice
	// Arrays are the viewer's job arrays, newest first, at most
	// maxArraysShown; MoreArrays counts those left out.
	Arrays     []api.ArrayView
	MoreArrays int
}

// maxArraysShown bounds the arrays the sessions page lists.
const maxArraysShown = 20

func (c *Console) sessionsView(k *caller) (sessionsView, error) {
	var v sessionsView
	if err := k.call("GET", "/api/v1/whoami", nil, &v.Me); err != nil {
		return v, err
	}
	all, err := listSessions(k, "owner="+q(v.Me.Subject))
	if err != nil {
		return v, err
	}
	for _, s := range all {
		if s.Status.Phase.Terminal() {
			v.Finished++
		} else {
			v.Active = append(v.Active, s)
		}
	}
	// Newest first: the one just started is on top.
	sort.SliceStable(v.Active, func(i, j int) bool { return v.Active[i].Created.After(v.Active[j].Created) })
	var pl api.ProfileList
	if err := k.call("GET", "/api/v1/profiles", nil, &pl); err != nil {
		return v, err
	}
	v.Profiles = pl.Items
	var nl api.NodeList
	if err := k.call("GET", "/api/v1/nodes?devices=true", nil, &nl); err != nil {
		return v, err
	}
	v.Free = freeByModel(nl.Items)
	v.Whole = wholeFree(nl.Items)
	v.Devices = deviceChoices(nl.Items, v.Me.Subject)
	var al api.ArrayList
	if err := k.call("GET", "/api/v1/arrays", nil, &al); err != nil {
		return v, err
	}
	for _, a := range al.Items {
		if a.Owner == v.Me.Subject { // an admin's list holds everyone's
			v.Arrays = append(v.Arrays, a)
		}
	}
	sort.SliceStable(v.Arrays, func(i, j int) bool { return v.Arrays[i].Created.After(v.Arrays[j].Created) })
	if len(v.Arrays) > maxArraysShown {
		v.MoreArrays, v.Arrays = len(v.Arrays)-maxArraysShown, v.Arrays[:maxArraysShown]
	}
	return v, nil
}

// listSessions reads every page of GET /api/v1/sessions?query.
func listSessions(k *caller, query string) ([]api.SessionView, error) {
	var out []api.SessionView
	cont := ""
	for {
		path := "/api/v1/sessions?limit=500"
		if query != "" {
			path += "&" + query
		}
		if cont != "" {
			path += "&continue=" + q(cont)
		}
		var page api.SessionList
		if err := k.call("GET", path, nil, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if page.Continue == "" {
			return out, nil
		}
		cont = page.Continue
	}
}

// usage is GPU-hours of one user or group.
type usage struct {
	Name     string
	Sessions int
	GPUHours float64
}

// historyRow is a finished session and the GPU-hours it held.
type historyRow struct {
	api.SessionView
	GPUHours float64
}

type historyView struct {
	Me       api.Whoami
	Finished []historyRow
	ByUser   []usage
	ByGroup  []usage
	GPUHours float64
	// Teams is the chart of GPU-hours per team per day (teamusage.go).
	Teams struct {
		Me     api.Whoami
		Charts []teamChart
		// Standing is where each team stands now (teamstanding.go).
		Standing []standingRow
	}
}

// gpuHours is what a session held: its GPUs (head and Ray workers) times
// the time from its start to its end (or now, while it runs).
func gpuHours(s api.SessionView, now time.Time) float64 {
	if s.Status.Started == nil {
		return 0
	}
	end := now
	if s.Status.Finished != nil {
		end = *s.Status.Finished
	}
	gpus := s.Resources.GPUs
	if s.Ray != nil {
		gpus += s.Ray.Workers * s.Ray.WorkerResources.GPUs
	}
	h := end.Sub(*s.Status.Started).Hours()
	if h < 0 {
		return 0
	}
	if sh := s.Status.GPUShare; sh != nil { // a fraction counts as its share of a GPU
		return float64(sh.MilliGPUs()) / 1000 * h
	}
	return float64(gpus) * h
}

func (c *Console) historyView(k *caller) (historyView, error) {
	var v historyView
	if err := k.call("GET", "/api/v1/whoami", nil, &v.Me); err != nil {
		return v, err
	}
	all, err := listSessions(k, "")
	if err != nil {
		return v, err
	}
	now := c.cfg.Now()
	users, groups := map[string]*usage{}, map[string]*usage{}
	add := func(m map[string]*usage, name string, h float64) {
		u := m[name]
		if u == nil {
			u = &usage{Name: name}
			m[name] = u
		}
		u.Sessions++
		u.GPUHours += h
	}
	for _, s := range all {
		if !s.Status.Phase.Terminal() {
			continue
		}
		h := gpuHours(s, now)
		v.Finished = append(v.Finished, historyRow{s, h})
		v.GPUHours += h
		add(users, s.Owner, h)
		for _, g := range s.Groups {
			add(groups, g, h)
		}
	}
	sort.SliceStable(v.Finished, func(i, j int) bool {
		return finishedAt(v.Finished[i].SessionView).After(finishedAt(v.Finished[j].SessionView))
	})
	v.ByUser, v.ByGroup = sortedUsage(users), sortedUsage(groups)
	v.Teams.Me = v.Me
	if v.Teams.Charts, v.Teams.Standing, err = c.teamCharts(k); err != nil {
		return v, err
	}
	return v, nil
}

func finishedAt(s api.SessionView) time.Time {
	if s.Status.Finished != nil {
		return *s.Status.Finished
	}
	return s.Status.Updated
}

func sortedUsage(m map[string]*usage) []usage {
	out := make([]usage, 0, len(m))
	for _, u := range m {
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GPUHours != out[j].GPUHours {
			return out[i].GPUHours > out[j].GPUHours
		}
		return out[i].Name < out[j].Name
	})
	return out
}

type adminView struct {
	Nodes    []api.NodeSummary
	Users    []quotaRow
	Groups   []quotaRow
	Profiles []profileRow
}

type quotaRow struct {
	Name  string
	Quota state.Quota
}

type profileRow struct {
	state.Profile
	JSON string
}

func (c *Console) adminView(k *caller) (adminView, error) {
	var v adminView
	// The quotas route needs the admin role: the API's 403 is the page's.
	var ql api.QuotaList
	if err := k.call("GET", "/api/v1/quotas", nil, &ql); err != nil {
		return v, err
	}
	for name, qt := range ql.Users {
		v.Users = append(v.Users, quotaRow{name, qt})
	}
	for name, qt := range ql.Groups {
		v.Groups = append(v.Groups, quotaRow{name, qt})
	}
	sort.Slice(v.Users, func(i, j int) bool { return v.Users[i].Name < v.Users[j].Name })
	sort.Slice(v.Groups, func(i, j int) bool { return v.Groups[i].Name < v.Groups[j].Name })
	var nl api.NodeList
	if err := k.call("GET", "/api/v1/nodes", nil, &nl); err != nil {
		return v, err
	}
	v.Nodes = nl.Items
	var pl api.ProfileList
	if err := k.call("GET", "/api/v1/profiles", nil, &pl); err != nil {
		return v, err
	}
	for _, p := range pl.Items {
		v.Profiles = append(v.Profiles, profileRow{p, profileJSON(p)})
	}
	return v, nil
}

// shortModel drops the vendor from a GPU model for a tile.
func shortModel(m string) string {
	for _, p := range []string{"NVIDIA ", "Tesla "} {
		m = strings.TrimPrefix(m, p)
	}
	return m
}
