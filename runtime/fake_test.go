package runtime_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
)

func TestMain(m *testing.M) { os.Exit(runtimetest.Main(m)) }

// fakeExit is the Fake's reading of the harness's Exit command.
func fakeExit(s runtime.Spec) (int, bool) {
	if len(s.Args) == 2 && s.Args[0] == "exit" {
		n, err := strconv.Atoi(s.Args[1])
		return n, err == nil
	}
	return 0, false
}

func TestContractFake(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Runtime {
			f := runtime.NewFake(nil, "busybox")
			f.Exit = fakeExit
			return f
		},
		Image: "busybox",
		Serve: []string{"serve"},
		Exit:  func(code int) []string { return []string{"exit", strconv.Itoa(code)} },
	})
}

func TestContractContainerd(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Runtime {
			return runtimetest.New(t, runtime.ContainerdOptions{})
		},
		Image: runtimetest.ImageRef,
		Serve: []string{"sleep", "3600"},
		Exit:  func(code int) []string { return []string{"sh", "-c", "exit " + strconv.Itoa(code)} },
		Busy:  []string{"sh", "-c", "while :; do :; done"},
	})
}

func TestFakeCPUUsageIsSettable(t *testing.T) {
	ctx := context.Background()
	f := runtime.NewFake(nil, "busybox")
	if err := f.Start(ctx, runtime.Spec{ID: "c", Image: "busybox"}); err != nil {
		t.Fatal(err)
	}
	if err := f.SetCPUUsage("c", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if d, err := f.CPUUsage(ctx, "c"); err != nil || d != 3*time.Second {
		t.Fatalf("CPUUsage = %v, %v; want 3s", d, err)
	}
	if err := f.SetCPUUsage("nope", time.Second); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("SetCPUUsage of an unknown id: %v; want ErrNotFound", err)
	}
}
