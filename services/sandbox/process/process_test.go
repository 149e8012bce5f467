package process

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/sandboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRunner records its start and environment in its workspace (the only
// place it can write inside bubblewrap), starts a grandchild in its own
// process group (as agents do), then sleeps.
func fakeRunner(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "runner.sh")
	script := `#!/bin/sh
cd "$TASKRUNNER_WORKDIR" || exit 90
echo started >> starts.txt
env > env.tmp && mv env.tmp env.txt
perl -e 'setpgrp(0,0); open(F, ">", "grandchild.pid"); print F $$; close F; exec "sleep", "300"' &
exec sleep "${SLEEP:-300}"
`
	require.NoError(t, os.WriteFile(p, []byte(script), 0o755))
	return p
}

func alive(pid int) bool {
	_, ok := startTick(pid)
	return ok
}

func newProvider(t *testing.T, root, bin, bwrap string) *Provider {
	t.Helper()
	p, err := New(Config{RunnerBin: bin, WorkRoot: root, Bwrap: bwrap, KillGrace: 2 * time.Second}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return p
}

// bwrapUsable reports whether bubblewrap works here. `make test` installs
// it and sets TASKRUNNER_REQUIRE_SERVICES, and then its absence fails.
func bwrapUsable(t *testing.T) bool {
	t.Helper()
	p, err := New(Config{RunnerBin: "/bin/true", WorkRoot: t.TempDir()}, slog.New(slog.DiscardHandler))
	if err == nil && p.Isolated() {
		return true
	}
	if os.Getenv("TASKRUNNER_REQUIRE_SERVICES") == "1" {
		t.Fatalf("bubblewrap does not work here (`make bubblewrap` installs it): %v", err)
	}
	return false
}

// modes are the Bwrap settings to test: the isolated default, and the
// explicit plain-process mode.
func modes(t *testing.T) []string {
	m := []string{"never"}
	if bwrapUsable(t) {
		m = append(m, "auto")
	} else {
		t.Log("bubblewrap not usable here: testing plain processes only")
	}
	return m
}

func readStarts(root, id string) int {
	b, _ := os.ReadFile(filepath.Join(root, id, "work", "starts.txt"))
	return strings.Count(string(b), "started")
}

var timeoutSecs = regexp.MustCompile(`^([0-9]+)s$`)

func TestConformance(t *testing.T) {
	for _, mode := range modes(t) {
		t.Run("bwrap="+mode, func(t *testing.T) {
			bin := fakeRunner(t)
			sandboxtest.Run(t, func(t *testing.T) sandboxtest.Harness {
				root := filepath.Join(t.TempDir(), "sandboxes")
				p := newProvider(t, root, bin, mode)
				return sandboxtest.Harness{
					Provider: p,
					Instances: func(t *testing.T, taskID string) int {
						id := sandbox.Name(taskID)
						if _, err := os.Stat(filepath.Join(root, id)); err != nil {
							return 0
						}
						// Every start of the runner leaves a line; wait for the first.
						require.Eventually(t, func() bool { return readStarts(root, id) > 0 }, 10*time.Second, 20*time.Millisecond)
						return readStarts(root, id)
					},
					Deadline: func(t *testing.T, id string) time.Time {
						// timeout(1) in the sandbox's command line enforces it.
						st, err := p.readState(id)
						require.NoError(t, err)
						b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.PID))
						require.NoError(t, err)
						args := strings.Split(string(b), "\x00")
						for i, a := range args {
							if a == "timeout" {
								for _, b := range args[i+1:] {
									if m := timeoutSecs.FindStringSubmatch(b); m != nil {
										n, _ := strconv.Atoi(m[1])
										return st.CreatedAt.Add(time.Duration(n) * time.Second)
									}
								}
							}
						}
						t.Fatalf("no timeout(1) in %q", args)
						return time.Time{}
					},
					Residue: func(t *testing.T, taskID, id string) []string {
						var left []string
						entries, _ := os.ReadDir(root)
						for _, e := range entries {
							if strings.Contains(e.Name(), id) {
								left = append(left, e.Name())
							}
						}
						require.Eventually(t, func() bool { return len(procsOf(taskID)) == 0 }, 10*time.Second, 20*time.Millisecond)
						return left
					},
					Foreign: func(t *testing.T) {
						dir := filepath.Join(root, "someone-else")
						require.NoError(t, os.MkdirAll(dir, 0o755))
						require.NoError(t, os.WriteFile(filepath.Join(dir, "state.json"),
							[]byte(`{"id":"someone-else","pid":1,"labels":{"taskrunner.owner":"alice"}}`), 0o600))
					},
				}
			})
		})
	}
}

func TestRestartedProviderDestroysTheWholeTree(t *testing.T) {
	for _, mode := range modes(t) {
		t.Run("bwrap="+mode, func(t *testing.T) {
			bin := fakeRunner(t)
			root := filepath.Join(t.TempDir(), "sandboxes")
			p := newProvider(t, root, bin, mode)
			ctx := context.Background()
			id := uuid.NewString() // unique, so no other run's processes are counted
			spec := sandbox.Spec{TaskID: id, Owner: "alice",
				Env:      map[string]string{"TASKRUNNER_TASK_ID": id, "TASKRUNNER_EVENTS_ADDR": "127.0.0.1:7070"},
				Deadline: time.Now().Add(time.Hour)}
			sb, err := p.Create(ctx, spec)
			require.NoError(t, err)
			require.Equal(t, sandbox.StateRunning, sb.State)

			var env []byte
			require.Eventually(t, func() bool {
				env, _ = os.ReadFile(filepath.Join(root, sb.ID, "work", "env.txt"))
				return strings.Contains(string(env), "TASKRUNNER_TASK_ID="+id)
			}, 10*time.Second, 20*time.Millisecond)
			require.NotContains(t, string(env), "GITHUB_TOKEN")
			require.Eventually(t, func() bool { return len(procsOf(id)) >= 3 }, 10*time.Second, 20*time.Millisecond,
				"runner, sleep and the grandchild in its own process group are running")

			// A restarted Dispatch (a new provider on the same root) finds and
			// destroys the sandbox the old one started.
			p2 := newProvider(t, root, bin, mode)
			list, err := p2.List(ctx, map[string]string{sandbox.LabelTaskID: id})
			require.NoError(t, err)
			require.Len(t, list, 1)
			require.Equal(t, sandbox.StateRunning, list[0].State)
			st, err := p2.readState(sb.ID)
			require.NoError(t, err)
			require.NoError(t, p2.Destroy(ctx, sb.ID))
			require.Eventually(t, func() bool { return !alive(st.PID) }, 10*time.Second, 20*time.Millisecond)
			require.Eventually(t, func() bool { return len(procsOf(id)) == 0 }, 10*time.Second, 20*time.Millisecond,
				"processes of the sandbox survived Destroy: %v", procsOf(id))
			_, err = p2.Get(ctx, sb.ID)
			require.ErrorIs(t, err, sandbox.ErrNotFound)
		})
	}
}

func TestDestroyRemovesTheTasksFiles(t *testing.T) {
	root := filepath.Join(t.TempDir(), "sandboxes")
	p := newProvider(t, root, fakeRunner(t), "never")
	ctx := context.Background()
	id := uuid.NewString()
	sb, err := p.Create(ctx, sandbox.Spec{TaskID: id, Owner: "o", Env: map[string]string{"TASKRUNNER_TASK_ID": id}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return readStarts(root, sb.ID) == 1 }, 10*time.Second, 20*time.Millisecond)
	// A file the agent made unwritable, and the log an earlier version
	// kept beside the directory.
	ro := filepath.Join(root, sb.ID, "work", "ro")
	require.NoError(t, os.MkdirAll(ro, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ro, "f"), []byte("x"), 0o400))
	require.NoError(t, os.Chmod(ro, 0o500))
	require.NoError(t, os.WriteFile(filepath.Join(root, sb.ID+".log"), []byte("old log"), 0o644))
	require.FileExists(t, filepath.Join(root, sb.ID, "runner.log"))

	require.NoError(t, p.Destroy(ctx, sb.ID))
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing of the task is left in the work root")

	// A directory without state (a Create that died half-way) goes too.
	require.NoError(t, os.MkdirAll(filepath.Join(root, "taskrunner-half", "work"), 0o755))
	require.NoError(t, p.Destroy(ctx, "taskrunner-half"))
	require.NoDirExists(t, filepath.Join(root, "taskrunner-half"))
	// Ids that are not sandbox names never reach the file system.
	outside := filepath.Join(filepath.Dir(root), "keep")
	require.NoError(t, os.MkdirAll(outside, 0o755))
	require.NoError(t, p.Destroy(ctx, "../keep"))
	require.DirExists(t, outside)
}

func TestDeadlineEnforced(t *testing.T) {
	for _, mode := range modes(t) {
		t.Run("bwrap="+mode, func(t *testing.T) {
			p := newProvider(t, filepath.Join(t.TempDir(), "sb"), fakeRunner(t), mode)
			ctx := context.Background()
			sb, err := p.Create(ctx, sandbox.Spec{TaskID: "task-deadline", Owner: "o", Deadline: time.Now().Add(1500 * time.Millisecond)})
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				got, err := p.Get(ctx, sb.ID)
				return err == nil && got.State == sandbox.StateExited && got.ExitCode != nil
			}, 15*time.Second, 50*time.Millisecond)
			got, _ := p.Get(ctx, sb.ID)
			require.Equal(t, 124, *got.ExitCode, "timeout(1) exit status")
			require.NoError(t, p.Destroy(ctx, sb.ID))
		})
	}
}

// TestTasksCannotReachEachOther runs task B, which keeps a secret in its
// workspace, then task A, which tries to read it, write into B's
// workspace, list the work root and write outside its own workspace, and
// reports what happened in its own workspace. As root it also hands a
// directory to the agent user and writes there as that user, the way the
// runner starts the agent.
func TestTasksCannotReachEachOther(t *testing.T) {
	if !bwrapUsable(t) {
		t.Skip("bubblewrap is not installed (`make bubblewrap`)")
	}
	bin := filepath.Join(t.TempDir(), "runner.sh")
	require.NoError(t, os.WriteFile(bin, []byte(`#!/bin/sh
cd "$TASKRUNNER_WORKDIR" || exit 90
if [ -z "$PEER" ]; then
  echo secret-of-b > secret.txt
  exec sleep 300
fi
r=report.tmp
if cat "$PEER/secret.txt" >> $r 2>/dev/null; then echo READ-PEER >> $r; else echo read-peer-denied >> $r; fi
if echo pwned 2>/dev/null > "$PEER/pwned.txt"; then echo WROTE-PEER >> $r; else echo write-peer-denied >> $r; fi
if echo pwned 2>/dev/null > "$ROOT/pwned.txt"; then echo WROTE-ROOT >> $r; else echo write-root-denied >> $r; fi
if echo pwned 2>/dev/null > "$OUTSIDE/pwned.txt"; then echo WROTE-OUTSIDE >> $r; else echo write-outside-denied >> $r; fi
echo "root-listing: $(ls "$ROOT" | tr '\n' ' ')" >> $r
echo own > own.txt && echo wrote-own >> $r
if [ "$(id -u)" = 0 ]; then
  mkdir agent && chown 65534:65534 agent &&
    setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo "$(id -u)" > agent/who.txt' && echo agent-wrote >> $r
  setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'mkdir /tmp/agent-65534' && echo agent-tmp >> $r
fi
mv $r report.txt
exec sleep 300
`), 0o755))
	outside := t.TempDir()
	root := filepath.Join(t.TempDir(), "sandboxes")
	p := newProvider(t, root, bin, "auto")
	require.True(t, p.Isolated())
	ctx := context.Background()

	b, err := p.Create(ctx, sandbox.Spec{TaskID: uuid.NewString(), Owner: "bob"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Destroy(ctx, b.ID) })
	bWork := filepath.Join(root, b.ID, "work")
	require.Eventually(t, func() bool { _, err := os.Stat(filepath.Join(bWork, "secret.txt")); return err == nil }, 10*time.Second, 20*time.Millisecond)

	a, err := p.Create(ctx, sandbox.Spec{TaskID: uuid.NewString(), Owner: "alice",
		Env: map[string]string{"PEER": bWork, "ROOT": root, "OUTSIDE": outside}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Destroy(ctx, a.ID) })
	aWork := filepath.Join(root, a.ID, "work")
	var report string
	require.Eventually(t, func() bool {
		r, err := os.ReadFile(filepath.Join(aWork, "report.txt"))
		report = string(r)
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)

	require.Contains(t, report, "read-peer-denied")
	require.NotContains(t, report, "secret-of-b")
	require.Contains(t, report, "write-peer-denied")
	require.Contains(t, report, "write-root-denied")
	require.Contains(t, report, "write-outside-denied")
	require.Contains(t, report, "root-listing: "+a.ID+" \n", "only its own directory exists in the work root")
	require.Contains(t, report, "wrote-own")
	require.NoFileExists(t, filepath.Join(bWork, "pwned.txt"))
	require.NoFileExists(t, filepath.Join(root, "pwned.txt"))
	require.NoFileExists(t, filepath.Join(outside, "pwned.txt"))
	require.FileExists(t, filepath.Join(aWork, "own.txt"))
	if os.Geteuid() == 0 {
		require.Contains(t, report, "agent-wrote", "the runner, root in the sandbox, can start the agent as an unprivileged user")
		require.Contains(t, report, "agent-tmp", "the unprivileged agent can write in its private /tmp (Claude Code makes /tmp/claude-<uid>)")
		who, err := os.ReadFile(filepath.Join(aWork, "agent", "who.txt"))
		require.NoError(t, err)
		require.Equal(t, "65534\n", string(who))
	}
}

func TestRefusesToStartWithoutBubblewrap(t *testing.T) {
	lg := slog.New(slog.DiscardHandler)
	t.Setenv("PATH", t.TempDir()) // no bwrap on it
	t.Setenv(UnisolatedEnv, "")
	cfg := Config{RunnerBin: "/bin/true", WorkRoot: t.TempDir()}

	_, err := New(cfg, lg)
	require.ErrorContains(t, err, "apt-get install bubblewrap")
	require.ErrorContains(t, err, "TASKRUNNER_PROCESS_UNISOLATED=1")

	t.Setenv(UnisolatedEnv, "1")
	p, err := New(cfg, lg)
	require.NoError(t, err)
	require.False(t, p.Isolated())

	cfg.Bwrap = "always"
	_, err = New(cfg, lg)
	require.ErrorContains(t, err, "apt-get install bubblewrap", "always never falls back, escape hatch or not")

	t.Setenv(UnisolatedEnv, "")
	cfg.Bwrap, cfg.Unisolated = "auto", true
	p, err = New(cfg, lg)
	require.NoError(t, err)
	require.False(t, p.Isolated())
}

func TestConfigErrors(t *testing.T) {
	lg := slog.New(slog.DiscardHandler)
	_, err := New(Config{WorkRoot: t.TempDir()}, lg)
	require.ErrorContains(t, err, "TASKRUNNER_PROCESS_RUNNER_BIN")
	_, err = New(Config{RunnerBin: "/nonexistent/runner", WorkRoot: t.TempDir()}, lg)
	require.ErrorContains(t, err, "not an executable")
	_, err = New(Config{RunnerBin: "/bin/true", WorkRoot: t.TempDir(), Bwrap: "sometimes"}, lg)
	require.ErrorContains(t, err, "TASKRUNNER_PROCESS_BWRAP")
}

// procsOf lists the pids whose environment names the task.
func procsOf(taskID string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		if _, ok := startTick(pid); ok && strings.Contains(string(b), "TASKRUNNER_TASK_ID="+taskID+"\x00") {
			out = append(out, pid)
		}
	}
	return out
}

// TestCreateAdoptsARunnerStartedBeforeACrash: Dispatch was killed after
// starting a task's runner and before recording it (no state file). The
// next Create finds the live runner and adopts it: one runner per task.
func TestCreateAdoptsARunnerStartedBeforeACrash(t *testing.T) {
	root := filepath.Join(t.TempDir(), "sandboxes")
	bin := fakeRunner(t)
	p := newProvider(t, root, bin, "never")
	ctx := context.Background()
	spec := sandbox.Spec{TaskID: "6f1c1c9e-9d7e-4a39-9d0e-3b8f0b1c2d3e", Owner: "alice", Deadline: time.Now().Add(time.Hour)}
	sb, err := p.Create(ctx, spec)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return readStarts(root, sb.ID) == 1 }, 10*time.Second, 20*time.Millisecond)
	// The crash: the state file was never written.
	require.NoError(t, os.Remove(p.statePath(sb.ID)))

	restarted := newProvider(t, root, bin, "never")
	again, err := restarted.Create(ctx, spec)
	require.NoError(t, err)
	require.Equal(t, sb.ID, again.ID)
	got, err := restarted.Get(ctx, sb.ID)
	require.NoError(t, err)
	require.Equal(t, sandbox.StateRunning, got.State, "the adopted runner is the sandbox")
	require.Never(t, func() bool { return readStarts(root, sb.ID) > 1 }, 500*time.Millisecond, 50*time.Millisecond, "no second runner")
	require.NoError(t, restarted.Destroy(ctx, sb.ID))
}

func TestHiddenPathDirs(t *testing.T) {
	root, err := os.MkdirTemp("/tmp", "pathdirs-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	bin := filepath.Join(root, "node_modules", ".bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	other := filepath.Join(root, "tools")
	require.NoError(t, os.MkdirAll(other, 0o755))
	got := hiddenPathDirs([]string{"/usr/bin", bin, other, bin, "relative", filepath.Join(root, "missing")})
	require.Equal(t, []string{filepath.Join(root, "node_modules"), other}, got,
		"only what /tmp would hide, node_modules whole, once each")
	require.Equal(t, []string{"/tmp/a", "/tmp/a/b"}, parentsBelowTmp("/tmp/a/b/node_modules"))
	require.Empty(t, parentsBelowTmp("/tmp/a"))
	require.Empty(t, parentsBelowTmp("/work/main/.dev/bin/runner"), "only what the private /tmp hides")

	// Inside the sandbox the agent user can reach them (bwrap alone would
	// make the parents 0700).
	if !bwrapUsable(t) || os.Geteuid() != 0 {
		return
	}
	tool := filepath.Join(bin, "tool")
	require.NoError(t, os.WriteFile(tool, []byte("#!/bin/sh\necho reached\n"), 0o755))
	require.NoError(t, os.Chmod(root, 0o755))
	// The runner binary in the same hidden tree, bound first (as in a
	// checkout under /tmp: .dev/bin/runner beside node_modules).
	runnerBin := filepath.Join(root, ".dev", "bin", "runner")
	require.NoError(t, os.MkdirAll(filepath.Dir(runnerBin), 0o755))
	require.NoError(t, os.WriteFile(runnerBin, []byte("#!/bin/sh\n"), 0o755))
	p := newProvider(t, filepath.Join(t.TempDir(), "sandboxes"), runnerBin, "auto")
	args := p.bwrapArgs(t.TempDir(), []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", tool}, bin)
	out, err := exec.Command(p.bwrap, args...).CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "reached")
}
