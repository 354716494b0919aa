package arch

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArchitectureNames checks that every file, directory, flag, program
// and Go or C name ARCHITECTURE.md mentions in backquotes exists today,
// so the map cannot silently go stale when code moves.
func TestArchitectureNames(t *testing.T) {
	root := "../.."
	doc, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	sources := sourceText(t, root)
	ident := regexp.MustCompile(`^\*?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(string(doc), -1) {
		name := m[1]
		switch {
		case strings.ContainsAny(name, "<> \",{}()"):
			// a pattern, a command line or a literal, not a name
		case strings.HasPrefix(name, "--"):
			if !strings.Contains(sources, `"`+strings.TrimPrefix(name, "--")+`"`) {
				t.Errorf("ARCHITECTURE.md names flag %s, which no program defines", name)
			}
		case strings.HasPrefix(name, "membrane-") && !strings.Contains(name, "/"):
			if _, err := os.Stat(filepath.Join(root, "cmd", name)); err != nil && !strings.Contains(sources, `"`+name+`"`) {
				t.Errorf("ARCHITECTURE.md names %s, which is neither a program nor a subcommand", name)
			}
		case strings.Contains(name, "/") || regexp.MustCompile(`\.(go|c|h|md|yaml)$`).MatchString(name):
			if !pathExists(root, name) {
				t.Errorf("ARCHITECTURE.md names %s, which does not exist", name)
			}
		case ident.MatchString(name):
			parts := strings.Split(strings.TrimPrefix(name, "*"), ".")
			last := parts[len(parts)-1]
			if len(last) > 1 && !regexp.MustCompile(`\b`+regexp.QuoteMeta(last)+`\b`).MatchString(sources) {
				t.Errorf("ARCHITECTURE.md names %s, which no source file declares or uses", name)
			}
		}
	}
}

// pathExists finds name as a path from the repository root, or as a file
// of the package directory the page is describing (actors/..., cmd/...).
func pathExists(root, name string) bool {
	name = strings.TrimSuffix(strings.TrimSuffix(name, "/..."), "/")
	for _, dir := range []string{".", "actors", "pkg/agent", "pkg/agent/api", "pkg/agent/k8s", "datapath", "bpf", "restore"} {
		if m, _ := filepath.Glob(filepath.Join(root, dir, name)); len(m) > 0 {
			return true
		}
	}
	return false
}

// sourceText is every Go and C source of the module, tests included (the
// page names tests), concatenated.
func sourceText(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "third_party" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		if ext := filepath.Ext(path); ext == ".go" || ext == ".c" || ext == ".h" {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			b.Write(src)
			b.WriteByte('\n')
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
