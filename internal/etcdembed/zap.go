package etcdembed

import (
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// quietZap is the etcd client's logger: errors only. The client logs every
// retry at warn level, which buries Voyager's own structured logs.
func quietZap() *zap.Logger {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	l, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return l
}

// serverZap is the embedded server's logger at level: JSON to stderr, like
// etcd's own, minus the errors every clean shutdown produces ("use of
// closed network connection", "server closed" from its listeners), which
// would otherwise greet each Ctrl-C of voyager dev with stack traces.
func serverZap(level string) *zap.Logger {
	cfg := zap.NewProductionConfig()
	var lvl zapcore.Level
	if err := lvl.Set(level); err == nil {
		cfg.Level = zap.NewAtomicLevelAt(lvl)
	}
	cfg.DisableStacktrace = true
	l, err := cfg.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return shutdownNoise{c} }))
	if err != nil {
		return zap.NewNop()
	}
	return l
}

// shutdownNoise drops the listener errors of a server being closed.
type shutdownNoise struct{ zapcore.Core }

func (s shutdownNoise) With(fields []zapcore.Field) zapcore.Core {
	return shutdownNoise{s.Core.With(fields)}
}

func (s shutdownNoise) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !s.Enabled(e.Level) {
		return ce
	}
	return ce.AddCore(e, s)
}

func (s shutdownNoise) Write(e zapcore.Entry, fields []zapcore.Field) error {
	if e.Message == "setting up serving from embedded etcd failed." {
		for _, f := range fields {
			if f.Key == "error" {
				if err, ok := f.Interface.(error); ok && isClosedListener(err.Error()) {
					return nil
				}
			}
		}
	}
	return s.Core.Write(e, fields)
}

func isClosedListener(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "use of closed network connection") || strings.Contains(msg, "server closed")
}
