package watcher_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdembed"
	"github.com/voyager-gpu/voyager/watcher"
)

// A cache of JSON values under one prefix: start it, wait for the first
// list, read snapshots, and follow changes.
func Example() {
	dir, err := os.MkdirTemp("", "watcher-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Config{Dir: dir, NoFsync: true})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	cli, err := srv.Client()
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	put := func(key, value string) {
		if _, err := cli.Put(ctx, key, value); err != nil {
			log.Fatal(err)
		}
	}
	put("/example/nodes/a", `{"gpus":8}`)
	put("/example/nodes/b", `{"gpus":4}`)

	type node struct {
		GPUs int `json:"gpus"`
	}
	nodes := watcher.New(cli, "/example/nodes/", watcher.JSON[node], watcher.Options{
		Name:   "nodes",
		Logger: slog.New(slog.DiscardHandler),
	})
	changes := nodes.Subscribe(16) // closed when Run returns
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- nodes.Run(runCtx) }()
	if err := nodes.WaitSynced(ctx); err != nil {
		log.Fatal(err)
	}

	snap := nodes.Snapshot() // immutable: keep it, read it from any goroutine
	for _, it := range snap.List() {
		fmt.Println(it.Key, it.Value.GPUs)
	}

	put("/example/nodes/b", `{"gpus":2}`)
	for ev := range changes {
		fmt.Println(ev.Type, ev.Key, ev.Value.GPUs, ev.Synthetic)
		if ev.Type == watcher.Modified {
			fmt.Println("was", ev.Prev.GPUs)
			break
		}
	}
	stop()
	for range changes { // drain until Run closes it
	}
	fmt.Println(<-done, snap.Len())
	// Output:
	// /example/nodes/a 8
	// /example/nodes/b 4
	// added /example/nodes/a 8 true
	// added /example/nodes/b 4 true
	// modified /example/nodes/b 2 false
	// was 4
	// <nil> 2
}
