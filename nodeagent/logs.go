package nodeagent

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// LogsPath is the route under which the agent serves session logs:
// GET LogsPath + <container id>?exp=E&key=K&tail=N&follow=true|false.
//
// This is the contract the API's /sessions/<id>/logs proxies (api/logs.go):
// 200 text/plain, the container's stdout and stderr (tail=N: the last N
// lines, 0: all); with follow=true the response stays open and streams new
// output until the container has exited, then ends. The key is an HMAC of
// the container id and the expiry E (Unix seconds) under a secret kept in
// the log directory: the URL with its key is published in
// status.urls.logs, which only the API reads, so the agent needs no user
// authentication of its own. A URL stops working at E (LogURLTTL after it
// was made); the agent re-signs a running session's URL in its status
// before it expires.
const LogsPath = state.AgentLogsPath

// logKeyFile holds the agent's log-URL secret, in LogDir, so that URLs
// published before a restart keep working after it.
const logKeyFile = ".logs-key"

// followPoll is how often a followed log is checked for new output.
const followPoll = 200 * time.Millisecond

type logKey struct {
	once sync.Once
	key  []byte
	err  error
}

// logSecret loads (or creates) the secret that signs log URLs.
func (a *Agent) logSecret() ([]byte, error) {
	a.logKey.once.Do(func() {
		if a.cfg.LogDir == "" {
			a.logKey.err = errors.New("the agent keeps no logs (no log directory)")
			return
		}
		path := filepath.Join(a.cfg.LogDir, logKeyFile)
		if b, err := os.ReadFile(path); err == nil && len(b) >= 32 {
			a.logKey.key = b
			return
		}
		if err := os.MkdirAll(a.cfg.LogDir, 0o700); err != nil {
			a.logKey.err = fmt.Errorf("create log directory: %w", err)
			return
		}
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			a.logKey.err = fmt.Errorf("make log key: %w", err)
			return
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			a.logKey.err = fmt.Errorf("write log key: %w", err)
			return
		}
		a.logKey.key = b
	})
	return a.logKey.key, a.logKey.err
}

// logSignature signs container id's log URL valid until exp (Unix
// seconds).
func (a *Agent) logSignature(id string, exp int64) (string, error) {
	secret, err := a.logSecret()
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(id + "\x00" + strconv.FormatInt(exp, 10)))
	return hex.EncodeToString(m.Sum(nil))[:32], nil
}

// logsURL is the URL of container id's log for status.urls.logs, valid
// for LogURLTTL, and when it expires; "" if the agent serves no logs (no
// LogsBaseURL or LogDir configured).
func (a *Agent) logsURL(id string) (string, time.Time) {
	if a.cfg.LogsBaseURL == "" || a.cfg.LogDir == "" {
		return "", time.Time{}
	}
	exp := time.Now().Add(a.cfg.LogURLTTL).Truncate(time.Second)
	sig, err := a.logSignature(id, exp.Unix())
	if err != nil {
		a.log.Warn("cannot publish a log URL", "container", id, "err", err)
		return "", time.Time{}
	}
	return strings.TrimRight(a.cfg.LogsBaseURL, "/") + LogsPath + url.PathEscape(id) + "?exp=" + strconv.FormatInt(exp.Unix(), 10) + "&key=" + sig, exp
}

// checkKey checks the exp and key query parameters of a request for
// container id's log (or its Ray dashboard, which the same key opens): it
// returns 0, or the HTTP status and message of a refusal.
func (a *Agent) checkKey(id string, q url.Values) (int, string) {
	exp, err := strconv.ParseInt(q.Get("exp"), 10, 64)
	if err != nil {
		return http.StatusForbidden, "forbidden: the URL has no expiry (exp); use the one in the session's status.urls.logs"
	}
	if time.Now().Unix() > exp {
		return http.StatusForbidden, "forbidden: this URL expired at " + time.Unix(exp, 0).UTC().Format(time.RFC3339) + "; the session's status.urls.logs has a fresh one while the log is kept"
	}
	want, err := a.logSignature(id, exp)
	if err != nil {
		return http.StatusServiceUnavailable, "logs unavailable: " + err.Error()
	}
	if !hmac.Equal([]byte(q.Get("key")), []byte(want)) {
		return http.StatusForbidden, "forbidden: the key does not match this container"
	}
	return 0, ""
}

// LogsHandler serves session logs at LogsPath; mount it on the agent's
// HTTP server.
func (a *Agent) LogsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
			return
		}
		id := strings.TrimPrefix(r.URL.Path, LogsPath)
		if id == "" || strings.ContainsAny(id, "/\\") || strings.HasPrefix(id, ".") {
			http.Error(w, "not found: want "+LogsPath+"<container id>", http.StatusNotFound)
			return
		}
		if code, msg := a.checkKey(id, r.URL.Query()); code != 0 {
			http.Error(w, msg, code)
			return
		}
		q := r.URL.Query()
		tail := 0
		if s := q.Get("tail"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				http.Error(w, fmt.Sprintf("bad tail %q: want a whole number of lines, 0 for all", s), http.StatusBadRequest)
				return
			}
			tail = n
		}
		follow, _ := strconv.ParseBool(q.Get("follow"))
		path := filepath.Join(a.cfg.LogDir, id+".log")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if err := a.serveLog(r.Context(), w, id, path, tail, follow); err != nil {
			a.log.Debug("serve log", "container", id, "err", err)
		}
	})
}

// serveLog writes the log (or its last tail lines), then, when following,
// what the container writes until it has exited.
func (a *Agent) serveLog(ctx context.Context, w http.ResponseWriter, id, path string, tail int, follow bool) error {
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	var off int64
	if tail > 0 {
		fi, err := os.Stat(path)
		if err == nil {
			off = fi.Size()
		}
		lines, err := runtime.Tail(path, tail)
		if err != nil {
			return err
		}
		for _, l := range lines {
			if _, err := io.WriteString(w, l+"\n"); err != nil {
				return err
			}
		}
	} else {
		n, err := copyFrom(w, path, 0)
		if err != nil {
			return err
		}
		off = n
	}
	flush()
	if !follow {
		return nil
	}
	t := time.NewTicker(followPoll)
	defer t.Stop()
	for {
		running := a.containerRunning(ctx, id)
		if fi, err := os.Stat(path); err == nil && fi.Size() < off {
			off = 0 // trimmed in place (TrimLog): start over from its marker
		}
		n, err := copyFrom(w, path, off)
		if err != nil {
			return err
		}
		off += n
		if n > 0 {
			flush()
		}
		if !running {
			return nil // exited, and everything it wrote has been sent
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (a *Agent) containerRunning(ctx context.Context, id string) bool {
	info, err := a.cfg.Runtime.Status(ctx, id)
	return err == nil && info.State == runtime.StateRunning
}

// copyFrom copies path from offset off to w and returns how many bytes.
func copyFrom(w io.Writer, path string, off int64) (int64, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, fmt.Errorf("seek log: %w", err)
	}
	return io.Copy(w, f)
}

// logPruneEvery is how often the agent looks for old log files.
const logPruneEvery = time.Hour

// pruneLogs removes the log files in LogDir of containers not in live
// that nothing wrote to for LogRetention, with their GPU and NCCL topology files,
// and returns how many it removed. The log-URL key and other files stay.
func (a *Agent) pruneLogs(now time.Time, live map[string]bool) (int, error) {
	entries, err := os.ReadDir(a.cfg.LogDir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read log directory: %w", err)
	}
	removed := 0
	var errs []error
	for _, e := range entries {
		var id string
		ok := false
		for _, suffix := range []string{".log", topologySuffix, ncclTopoSuffix} {
			if id, ok = strings.CutSuffix(e.Name(), suffix); ok {
				break
			}
		}
		if !ok || e.IsDir() || live[id] {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < a.cfg.LogRetention {
			continue
		}
		if err := os.Remove(filepath.Join(a.cfg.LogDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove log %s: %w", e.Name(), err))
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}
