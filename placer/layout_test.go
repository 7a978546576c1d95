package placer

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// plannerFiles are the pure planner: what the API, the lifecycle controller
// and placer/sim call without a placer running.
var plannerFiles = []string{"snapshot.go", "plan.go", "order.go", "fairshare.go", "hold.go", "filter.go", "score.go", "pack.go", "preempt.go", "epoch.go"}

// TestPlannerImportsNoEtcd keeps the planner pure: none of its files may
// import an etcd package, the watcher (etcd's caches) or context (a planner
// that waits on something is an engine).
func TestPlannerImportsNoEtcd(t *testing.T) {
	fset := token.NewFileSet()
	for _, name := range plannerFiles {
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, "go.etcd.io/") || path == "context" || strings.HasSuffix(path, "/voyager/watcher") {
				t.Errorf("%s imports %s: the planner's files read a Snapshot and talk to nothing (placer/README.md, Layout)", name, path)
			}
		}
	}
}

// TestLayoutMatchesREADME holds placer/README.md's layout table to the
// package's files: every non-test Go file has a row, and every row a file.
func TestLayoutMatchesREADME(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatalf("read README.md: %v", err)
	}
	text := string(b)
	start := strings.Index(text, "## Layout")
	if start < 0 {
		t.Fatal("README.md has no ## Layout section")
	}
	section := text[start+len("## Layout"):]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	row := regexp.MustCompile("(?m)^\\| `([^`]+\\.go)` \\|")
	var listed []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		listed = append(listed, m[1])
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			have = append(have, f)
		}
	}
	for _, f := range have {
		if !slices.Contains(listed, f) {
			t.Errorf("%s has no row in README.md's layout table", f)
		}
	}
	for _, f := range listed {
		if !slices.Contains(have, f) {
			t.Errorf("README.md's layout table lists %s, which is not a file of the package", f)
		}
	}
	for _, f := range plannerFiles {
		if !slices.Contains(listed, f) {
			t.Errorf("planner file %s is not in the layout table", f)
		}
	}
}
