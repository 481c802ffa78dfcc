package layers

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/toolbatch/toolbatch"

// TestImportsFollowDocs checks every package's non-test imports against
// the "Imports:" line of its doc.go.
func TestImportsFollowDocs(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string][]string{} // package dir -> its non-test Go files
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			pkgs[filepath.Dir(path)] = append(pkgs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 15 {
		t.Fatalf("found %d packages under %s: is this the module root?", len(pkgs), root)
	}
	dirs := make([]string, 0, len(pkgs))
	for dir := range pkgs {
		dirs = append(dirs, dir)
	}
	sort.Strings(dirs)
	for _, dir := range dirs {
		rel, _ := filepath.Rel(root, dir)
		allowed, err := allowedImports(filepath.Join(dir, "doc.go"))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		fset := token.NewFileSet()
		for _, file := range pkgs[dir] {
			f, err := parser.ParseFile(fset, file, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, spec := range f.Imports {
				path, _ := strconv.Unquote(spec.Path.Value)
				if !permitted(path, allowed) {
					base := filepath.Base(file)
					t.Errorf("%s/%s imports %s, which %s/doc.go does not allow (Imports: %s)", rel, base, path, rel, strings.Join(allowed, ", "))
				}
			}
		}
	}
}

// allowedImports reads the Imports: line of a doc.go (it may go on over
// the next comment lines): comma-separated entries, ended by a period.
func allowedImports(docFile string) ([]string, error) {
	data, err := os.ReadFile(docFile)
	if err != nil {
		return nil, err
	}
	var text string
	found := false
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "// Imports:"); ok {
			found, text = true, rest
		} else if found && strings.HasPrefix(line, "//") && !strings.HasSuffix(strings.TrimSpace(text), ".") {
			text += " " + strings.TrimPrefix(line, "//")
		} else if found {
			break
		}
	}
	if !found {
		return nil, os.ErrNotExist
	}
	text = strings.TrimSuffix(strings.TrimSpace(text), ".")
	if text == "nothing but the standard library" {
		return nil, nil
	}
	var out []string
	for _, e := range strings.Split(text, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out, nil
}

// permitted reports whether an import path is the standard library's or
// covered by an allowed entry: one of this module's packages exactly, or
// another module's path and what is below it.
func permitted(path string, allowed []string) bool {
	first, _, _ := strings.Cut(path, "/")
	if !strings.Contains(first, ".") {
		return true // the standard library
	}
	for _, a := range allowed {
		if strings.Contains(strings.SplitN(a, "/", 2)[0], ".") {
			if path == a || strings.HasPrefix(path, a+"/") {
				return true
			}
		} else if path == module+"/"+a {
			return true
		}
	}
	return false
}
