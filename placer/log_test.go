package placer

import (
	"io"
	"log/slog"
	"os"
)

// quietLogger drops placer logs unless VOYAGER_TEST_LOG is set.
func quietLogger() *slog.Logger {
	if os.Getenv("VOYAGER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
