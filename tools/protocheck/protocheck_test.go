package protocheck

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(dir, "buf.gen.yaml"))
	return dir
}

func goTool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"tool"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go tool %v:\n%s", args, out)
	return string(out)
}

func TestBufLint(t *testing.T) {
	goTool(t, repoRoot(t), "buf", "lint")
}

// TestGeneratedCodeIsCurrent regenerates everything into a temporary
// directory and compares it file by file with what is committed.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	root := repoRoot(t)
	out := t.TempDir()
	goTool(t, root, "buf", "generate", "-o", out)
	for _, sub := range []string{"proto/gen", "proto/openapi"} {
		want := map[string][]byte{}
		require.NoError(t, filepath.WalkDir(filepath.Join(out, sub), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			rel, _ := filepath.Rel(out, p)
			want[rel] = b
			return err
		}))
		require.NotEmpty(t, want, "buf generated nothing under %s", sub)
		got := map[string][]byte{}
		require.NoError(t, filepath.WalkDir(filepath.Join(root, sub), func(p string, d fs.DirEntry, err error) error {
			// proto/openapi also holds its hand-written embedding package.
			if err != nil || d.IsDir() || sub == "proto/openapi" && filepath.Ext(p) == ".go" {
				return err
			}
			b, err := os.ReadFile(p)
			rel, _ := filepath.Rel(root, p)
			got[rel] = b
			return err
		}))
		for name, b := range want {
			require.Contains(t, got, name, "generated file %s is not committed: run make proto", name)
			require.True(t, bytes.Equal(b, got[name]), "%s differs from what buf generates: run make proto", name)
		}
		for name := range got {
			require.Contains(t, want, name, "%s is not generated any more: run make proto", name)
		}
	}
}
