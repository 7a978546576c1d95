package etcdembed

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestStartReuseAndQuietShutdown: a server keeps its data across a restart
// over the same directory, and the shutdown noise filter drops only the
// closed-listener errors.
func TestStartReuseAndQuietShutdown(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Dir: dir, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	_ = cli.Close()
	s.Close()
	s.Close() // idempotent

	s, err = Start(ctx, Config{Dir: dir, NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cli, err = s.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart /k = %v, %v", resp, err)
	}
	if _, err := Start(ctx, Config{}); err == nil {
		t.Error("Start without a data directory succeeded")
	}

	core, logs := observer.New(zapcore.DebugLevel)
	l := zap.New(shutdownNoise{core})
	l.Error("setting up serving from embedded etcd failed.", zap.Error(errors.New("accept tcp 127.0.0.1:1: use of closed network connection")))
	l.Error("setting up serving from embedded etcd failed.", zap.Error(errors.New("http: Server closed")))
	l.Error("setting up serving from embedded etcd failed.", zap.Error(errors.New("disk on fire")))
	l.Error("something else", zap.Error(errors.New("use of closed network connection")))
	if logs.Len() != 2 {
		var b bytes.Buffer
		for _, e := range logs.All() {
			b.WriteString(e.Message + "\n")
		}
		t.Errorf("kept %d entries, want 2 (the real error and the unrelated one):\n%s", logs.Len(), b.String())
	}
}

// TestAutoCompaction: with a compaction retention the embedded etcd
// compacts its history by itself: a read at an old revision is refused as
// compacted, while the current value stays.
func TestAutoCompaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Dir: t.TempDir(), NoFsync: true, CompactionRetention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	first, err := cli.Put(ctx, "/k", "0")
	if err != nil {
		t.Fatal(err)
	}
	// etcd's periodic compactor compacts to the revision it saw a retention
	// ago: keep writing so that there is a newer one.
	for i := 1; ; i++ {
		if _, err := cli.Put(ctx, "/k", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		_, err := cli.Get(ctx, "/k", clientv3.WithRev(first.Header.Revision))
		if errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal("no compaction within a minute with a retention of 1s")
		}
		time.Sleep(100 * time.Millisecond) // a write every 100ms: the history the compactor works on
	}
	if resp, err := cli.Get(ctx, "/k"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("current value after compaction: %v, %v", resp, err)
	}
}
