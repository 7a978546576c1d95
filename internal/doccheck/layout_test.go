package doccheck

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the directory of the module's go.mod, found upwards from the
// test's working directory (the package's own directory under go test).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("get working directory: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("find go.mod: none in any directory above the test's")
		}
		dir = parent
	}
}

// layoutRows returns the paths of the rows of README.md's "## Layout"
// table, in order: the first cell of each row, written `path`.
func layoutRows(t *testing.T, readme string) []string {
	t.Helper()
	start := strings.Index(readme, "\n## Layout\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Layout" section`)
	}
	section := readme[start+len("\n## Layout\n"):]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")
	var paths []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		paths = append(paths, m[1])
	}
	if len(paths) == 0 {
		t.Fatal(`README.md's "## Layout" section has no rows of the form | ` + "`path`" + ` | job |`)
	}
	return paths
}

// goPackageDirs returns every directory under root that holds a .go file,
// relative to root with forward slashes: the package directories that
// `go list ./...` lists. It skips what the go command skips: directories
// whose names begin with "." or "_", testdata, and nested modules.
func goPackageDirs(t *testing.T, root string) []string {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			seen[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	dirs := make([]string, 0, len(seen))
	for d := range seen {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	return dirs
}

// TestLayoutMatchesTree holds README.md's layout table to the repository:
//   - every Go package directory has a row of its own (a nested package,
//     such as placer/sim, is not covered by its parent's row: it has a
//     job of its own to state);
//   - every row names a file or directory that exists;
//   - every top-level directory neither hidden nor ignored by git (bin/,
//     build output) has a row naming it or a path under it, so non-Go
//     parts (deploy, docs) are in the table too.
func TestLayoutMatchesTree(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatalf("read README.md: %v", err)
	}
	rows := layoutRows(t, string(b))

	for _, dir := range goPackageDirs(t, root) {
		if dir == "." {
			t.Errorf("the repository's root holds Go files: give it a row or move them into a package")
			continue
		}
		if !slices.Contains(rows, dir) {
			t.Errorf("package %s has no row in README.md's Layout table", dir)
		}
	}
	for _, p := range rows {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil {
			t.Errorf("README.md's Layout table names %s, which does not exist: %v", p, err)
		}
	}
	seen := map[string]bool{}
	for _, p := range rows {
		if seen[p] {
			t.Errorf("README.md's Layout table names %s twice", p)
		}
		seen[p] = true
	}

	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatalf("read %s: %v", root, err)
	}
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || strings.HasPrefix(e.Name(), "_") || gitIgnored(root, e.Name()) {
			continue
		}
		covered := slices.ContainsFunc(rows, func(p string) bool {
			return p == e.Name() || strings.HasPrefix(p, e.Name()+"/")
		})
		if !covered {
			t.Errorf("top-level directory %s has no row (nor any path under it) in README.md's Layout table", e.Name())
		}
	}
}

// TestLayoutRowsParse checks the parser on a table written for it, so that
// a change of the table's shape cannot make TestLayoutMatchesTree pass on
// no rows at all.
func TestLayoutRowsParse(t *testing.T) {
	readme := "# X\n\n## Layout\n\ntext\n\n| Path | Job |\n|---|---|\n| `a` | one |\n| `a/b` | two ([link](a/b/README.md)) |\n\n## Next\n\n| `c` | not layout |\n"
	got := layoutRows(t, readme)
	if want := []string{"a", "a/b"}; !slices.Equal(got, want) {
		t.Fatalf("layoutRows = %q, want %q", got, want)
	}
}

// gitIgnored reports whether git ignores path (relative to root): build
// output such as bin/ is no part of the layout.
func gitIgnored(root, path string) bool {
	return exec.Command("git", "-C", root, "check-ignore", "-q", path).Run() == nil
}

// TestEveryPackageHasDocGo: every package with code (not only tests) has
// a doc.go whose package comment says its job: "// Package name …", or
// "// Command name …" for a command. A package comment elsewhere is moved
// there, so a reader finds it in one place.
func TestEveryPackageHasDocGo(t *testing.T) {
	root := repoRoot(t)
	for _, dir := range goPackageDirs(t, root) {
		abs := filepath.Join(root, filepath.FromSlash(dir))
		code, err := filepath.Glob(filepath.Join(abs, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		code = slices.DeleteFunc(code, func(f string) bool { return strings.HasSuffix(f, "_test.go") })
		if len(code) == 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(abs, "doc.go"))
		if err != nil {
			t.Errorf("package %s has no doc.go saying its job", dir)
			continue
		}
		if !regexp.MustCompile(`(?m)^// (Package|Command) \S+ .*\n(//.*\n)*package \w+`).Match(b) {
			t.Errorf("%s/doc.go has no package comment (// Package name … or // Command name …) right above its package clause", dir)
		}
	}
}
