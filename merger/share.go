package merger

import (
	"slices"

	"github.com/voyager-gpu/voyager/internal/rendezvous"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// share is this merger's share of the sessions when Config.Member is set:
// the live placers (placers/) share them by rendezvous hashing, so that
// each part's change is merged at once by one merger, not by every placer
// process's (with three placers, each merge had been read three times and
// two of the three found nothing left to write).
type share struct {
	member string
	ids    []string // the live placers' ids, sorted, always with member
}

// owns reports whether session id is this merger's to merge at once.
func (s *share) owns(id string) bool {
	if s == nil || len(s.ids) <= 1 {
		return true
	}
	return rendezvous.Owner(s.ids, id) == s.member
}

// placersChanged lists the live placers again and, when they changed,
// merges every known part of the sessions newly in this merger's share (a
// placer that left or died leaves its share's merges to the others).
func (m *Merger) placersChanged() {
	ids := []string{m.cfg.Member}
	for _, it := range m.placers.List() {
		if it.Value.ID != "" && it.Value.ID != m.cfg.Member {
			ids = append(ids, it.Value.ID)
		}
	}
	slices.Sort(ids)
	m.mu.Lock()
	before := *m.share
	same := slices.Equal(ids, m.share.ids)
	m.share.ids = ids
	m.mu.Unlock()
	if same {
		return
	}
	// Only the sessions newly in the share: those it owned before it
	// merged at once already.
	for _, it := range m.parts.List() {
		if node, id, ok := m.cfg.Keys.PartKey(it.Key); ok && m.owns(id) && !before.owns(id) {
			m.enqueue(id, node)
		}
	}
}

// owns reports whether session id's part changes are this merger's to
// merge at once (all of them without Config.Member).
func (m *Merger) owns(id string) bool {
	if m.share == nil {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.share.owns(id)
}

func newPlacersCache(m *Merger) *watcher.Cache[state.Placer] {
	c := watcher.New(m.cli, m.cfg.Keys.Placers(), watcher.JSON[state.Placer], watcher.Options{Name: "merger-placers", Logger: m.cfg.Logger})
	c.AddHandler(func(watcher.Event[state.Placer]) { m.placersChanged() })
	return c
}
