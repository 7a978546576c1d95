package etcdembed

import "go.uber.org/zap"

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
