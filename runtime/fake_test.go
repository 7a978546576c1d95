package runtime_test

import (
	"os"
	"strconv"
	"testing"

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
	})
}
