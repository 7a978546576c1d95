package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/voyager-gpu/voyager/internal/hostclean"
)

func main() {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "clean-host: run as root (it removes network namespaces, bridges, iptables chains and containers)")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep, err := hostclean.Sweep(ctx, hostclean.Options{All: true, Logger: log})
	for _, r := range rep.Removed {
		fmt.Println("removed", r)
	}
	fmt.Printf("clean-host: removed %d objects\n", len(rep.Removed))
	if err != nil {
		fmt.Fprintln(os.Stderr, "clean-host:", err)
		os.Exit(1)
	}
}
