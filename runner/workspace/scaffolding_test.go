package workspace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// upstream makes a repository with main (README.md and a tracked .claude/settings.json) and
// returns its path.
func upstream(t *testing.T) string {
	dir := t.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+os.DevNull,
			"GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@b", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@b")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	run("init", "-q", "-b", "main")
	write(t, dir, "README.md", "# r\n")
	write(t, dir, ".claude/settings.json", "{}\n")
	run("add", "-A")
	run("commit", "-qm", "init")
	return dir
}

func write(t *testing.T, dir, name, text string) {
	require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
}

func TestScaffoldingStaysOutAndFollowUpsStackCommits(t *testing.T) {
	ctx := context.Background()
	remote := upstream(t)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}

	w := New(Config{Dir: t.TempDir(), Env: env, TaskID: "t1", BaseBranch: "main"})
	require.NoError(t, w.Clone(ctx, remote, ""))
	// What `openspec init` writes.
	write(t, w.Dir(), ".claude/commands/opsx/apply.md", "x\n")
	write(t, w.Dir(), "openspec/config.yaml", "schema: x\n")
	write(t, w.Dir(), "AGENTS.md", "# agents\n")
	added, err := w.ExcludeScaffolding(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"AGENTS.md", "openspec/config.yaml"}, added)
	// What the agent writes.
	write(t, w.Dir(), "openspec/changes/c/proposal.md", "# c\n")
	write(t, w.Dir(), "openspec/specs/greet/spec.md", "## Purpose\n")
	write(t, w.Dir(), ".codex/state.json", "{}\n")
	write(t, w.Dir(), ".claude/settings.json", "{\"tracked\": true}\n")
	write(t, w.Dir(), "greet", "echo hi\n")

	st, err := w.DiffStats(ctx)
	require.NoError(t, err)
	ok, err := w.Commit(ctx, "change")
	require.NoError(t, err)
	require.True(t, ok)
	files, err := w.CommittedDiff(ctx)
	require.NoError(t, err)
	var paths []string
	for _, f := range files {
		paths = append(paths, f.Path)
	}
	require.ElementsMatch(t, []string{".claude/settings.json", "greet", "openspec/changes/c/proposal.md", "openspec/specs/greet/spec.md"}, paths,
		"a tracked file under .claude/ is committed; scaffolding is not")
	require.Equal(t, Stats{Additions: 4, Deletions: 1, FilesChanged: 4}, st, "diff stats are what the commit holds")
	require.NoError(t, w.Push(ctx, remote, ""))

	// A follow-up clones the task branch and commits on top of it.
	f := New(Config{Dir: t.TempDir(), Env: env, TaskID: "t1", BaseBranch: "main", FollowUp: true})
	require.NoError(t, f.Clone(ctx, remote, ""))
	head, err := w.HeadSHA(ctx)
	require.NoError(t, err)
	require.Equal(t, head, f.BaseSHA(), "a follow-up starts from the task branch's head")
	changes, err := f.BranchChanges(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"openspec/changes/c"}, changes)
	write(t, f.Dir(), "greet", "echo hi\necho bye\n")
	ok, err = f.Commit(ctx, "revise")
	require.NoError(t, err)
	require.True(t, ok)
	files, err = f.CommittedDiff(ctx)
	require.NoError(t, err)
	require.Equal(t, []FileStat{{Path: "greet", Additions: 1}}, files, "the run's own diff")
	require.NoError(t, f.Push(ctx, remote, ""), "a fast-forward push, no force")

	missing := New(Config{Dir: t.TempDir(), Env: env, TaskID: "t2", BaseBranch: "main", FollowUp: true})
	err = missing.Clone(ctx, remote, "")
	var ge *Error
	require.ErrorAs(t, err, &ge)
	require.Equal(t, KindBranchNotFound, ge.Kind)
}

func TestExcludeEscape(t *testing.T) {
	require.Equal(t, `a\*b\?c\[d`, excludeEscape("a*b?c[d"))
	require.Equal(t, `\#x`, excludeEscape("#x"))
	require.Equal(t, `\!x`, excludeEscape("!x"))
}
