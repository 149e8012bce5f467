package modcheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// modules are the workspace's modules (go.work), leaves first. tools/jaeger
// is not one: it only pins the Jaeger binary and is built on its own.
var modules = []string{"proto", "platform", "services", "gateway", "runner", "tools", "tools/bench"}

const repo = "github.com/taskrunner/taskrunner/"

// rule is one process's import rule: the packages (patterns relative to the
// repository root) whose non-test dependencies may not contain forbidden.
type rule struct {
	name      string
	packages  []string
	forbidden []string // import path prefixes
}

// The database, migrations and Prometheus client belong to taskrunnerd
// (services) only; tools sits on top of everything and nothing imports it.
var serverOnly = []string{
	repo + "services/", repo + "tools/",
	"github.com/jackc/pgx", "github.com/pressly/goose",
	"github.com/prometheus/", "go.opentelemetry.io/otel/exporters/prometheus", "go.opentelemetry.io/contrib/bridges/prometheus",
}

var rules = []rule{
	{"gateway binary", []string{"./gateway/cmd/gateway", "./gateway/..."}, append([]string{repo + "runner/"}, serverOnly...)},
	{"runner binary", []string{"./runner/cmd/runner", "./runner/..."}, append([]string{repo + "gateway/"}, serverOnly...)},
	{"platform (leaf module: proto and third-party only)", []string{"./platform/..."},
		append([]string{repo + "runner/", repo + "gateway/", "github.com/redis/go-redis"}, serverOnly...)},
}

func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.work")); err != nil {
		t.Fatalf("repository root not found from %s: %v", dir, err)
	}
	return dir
}

func goCmd(t *testing.T, dir string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

// TestProcessImports fails on a forbidden import and names the package that
// brought it in.
func TestProcessImports(t *testing.T) {
	dir := root(t)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			args := append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}, r.packages...)
			out, err := goCmd(t, dir, nil, args...)
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			importers := map[string][]string{}
			var deps []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(line)
				if len(f) == 0 {
					continue
				}
				deps = append(deps, f[0])
				for _, imp := range f[1:] {
					importers[imp] = append(importers[imp], f[0])
				}
			}
			if len(deps) == 0 {
				t.Fatal("go list found no packages")
			}
			var bad []string
			for _, d := range deps {
				for _, p := range r.forbidden {
					if strings.HasPrefix(d, p) || d+"/" == p {
						by := importers[d]
						sort.Strings(by)
						bad = append(bad, d+" (imported by "+strings.Join(by, ", ")+")")
						break
					}
				}
			}
			if len(bad) > 0 {
				t.Errorf("%s links what only taskrunnerd (or tools) may: move the shared code to platform/ or import it from there:\n  %s",
					r.name, strings.Join(bad, "\n  "))
			}
		})
	}
}

func slow(t *testing.T) {
	if os.Getenv("TASKRUNNER_SKIP_MODCHECK") == "1" {
		t.Skip("TASKRUNNER_SKIP_MODCHECK=1")
	}
}

// TestModulesBuildAlone builds every module outside the workspace.
func TestModulesBuildAlone(t *testing.T) {
	slow(t)
	dir := root(t)
	for _, m := range modules {
		t.Run(m, func(t *testing.T) {
			if out, err := goCmd(t, filepath.Join(dir, m), []string{"GOWORK=off"}, "build", "./..."); err != nil {
				t.Errorf("GOWORK=off go build ./... in %s: %v\n%s", m, err, out)
			}
		})
	}
}

// TestModulesTidy fails when `go mod tidy` would change a go.mod or go.sum.
func TestModulesTidy(t *testing.T) {
	slow(t)
	dir := root(t)
	for _, m := range modules {
		t.Run(m, func(t *testing.T) {
			out, err := goCmd(t, filepath.Join(dir, m), []string{"GOWORK=off", "GOFLAGS=-mod=mod"}, "mod", "tidy", "-diff")
			if err != nil {
				t.Errorf("%s is not tidy (run `cd %s && GOWORK=off go mod tidy`): %v\n%s", m, m, err, out)
			}
		})
	}
}
