package process

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskrunner/taskrunner/services/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRunner writes its environment and pid, starts a grandchild in its own
// process group (as agents do), then sleeps.
func fakeRunner(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "runner.sh")
	script := `#!/bin/sh
echo started >> "` + dir + `/starts.txt"
env > "$TASKRUNNER_WORKDIR/../env.tmp" && mv "$TASKRUNNER_WORKDIR/../env.tmp" "$TASKRUNNER_WORKDIR/../env.txt"
perl -e 'setpgrp(0,0); open(F, ">", "$ENV{TASKRUNNER_WORKDIR}/../grandchild.pid"); print F $$; close F; exec "sleep", "300"' &
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
	p, err := New(Config{RunnerBin: bin, WorkRoot: root, Bwrap: bwrap, KillGrace: 2 * time.Second}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return p
}

func modes(t *testing.T) []string {
	m := []string{"never"}
	if p, err := New(Config{RunnerBin: "/bin/true", WorkRoot: t.TempDir(), Bwrap: "auto"}, slog.New(slog.DiscardHandler)); err == nil && p.Isolated() {
		m = append(m, "always")
	} else {
		t.Log("bubblewrap not usable here: testing plain processes only")
	}
	return m
}

func TestLifecycle(t *testing.T) {
	for _, mode := range modes(t) {
		t.Run("bwrap="+mode, func(t *testing.T) {
			dir := t.TempDir()
			bin := fakeRunner(t, dir)
			root := filepath.Join(dir, "sandboxes")
			p := newProvider(t, root, bin, mode)
			ctx := context.Background()
			id := uuid.NewString() // unique, so no other run's processes are counted
			spec := sandbox.Spec{TaskID: id, Owner: "alice",
				Env:      map[string]string{"TASKRUNNER_TASK_ID": id, "TASKRUNNER_EVENTS_ADDR": "127.0.0.1:7070"},
				Deadline: time.Now().Add(time.Hour)}
			sb, err := p.Create(ctx, spec)
			require.NoError(t, err)
			require.Equal(t, sandbox.StateRunning, sb.State)
			require.Equal(t, "alice", sb.Labels[sandbox.LabelOwner])
			require.Equal(t, spec.TaskID, sb.TaskID())

			envFile := filepath.Join(root, sb.ID, "env.txt")
			var env []byte
			require.Eventually(t, func() bool {
				env, _ = os.ReadFile(envFile)
				return strings.Contains(string(env), "TASKRUNNER_TASK_ID="+spec.TaskID)
			}, 10*time.Second, 20*time.Millisecond)
			require.NotContains(t, string(env), "GITHUB_TOKEN")

			// Idempotent per task: no second process.
			again, err := p.Create(ctx, spec)
			require.NoError(t, err)
			require.Equal(t, sb.ID, again.ID)
			starts, _ := os.ReadFile(filepath.Join(dir, "starts.txt"))
			require.Equal(t, 1, strings.Count(string(starts), "started"))

			list, err := p.List(ctx, map[string]string{sandbox.LabelOwner: "alice"})
			require.NoError(t, err)
			require.Len(t, list, 1)
			list, err = p.List(ctx, map[string]string{sandbox.LabelOwner: "bob"})
			require.NoError(t, err)
			require.Empty(t, list)

			require.Eventually(t, func() bool { return len(procsOf(spec.TaskID)) >= 3 }, 10*time.Second, 20*time.Millisecond,
				"runner, sleep and the grandchild in its own process group are running")

			// A restarted Dispatch (a new provider on the same root) finds and
			// destroys the sandbox the old one started.
			p2 := newProvider(t, root, bin, mode)
			list, err = p2.List(ctx, map[string]string{sandbox.LabelTaskID: spec.TaskID})
			require.NoError(t, err)
			require.Len(t, list, 1)
			require.Equal(t, sandbox.StateRunning, list[0].State)
			st, err := p2.readState(sb.ID)
			require.NoError(t, err)
			require.NoError(t, p2.Destroy(ctx, sb.ID))
			require.Eventually(t, func() bool { return !alive(st.PID) }, 10*time.Second, 20*time.Millisecond)
			require.Eventually(t, func() bool { return len(procsOf(spec.TaskID)) == 0 }, 10*time.Second, 20*time.Millisecond,
				"processes of the sandbox survived Destroy: %v", procsOf(spec.TaskID))
			_, err = p2.Get(ctx, sb.ID)
			require.ErrorIs(t, err, sandbox.ErrNotFound)
			require.NoError(t, p2.Destroy(ctx, sb.ID), "destroying a missing sandbox is success")
			require.FileExists(t, filepath.Join(root, sb.ID+".log"))
		})
	}
}

func TestDeadlineEnforced(t *testing.T) {
	dir := t.TempDir()
	bin := fakeRunner(t, dir)
	p := newProvider(t, filepath.Join(dir, "sb"), bin, "never")
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
}

func TestConfigErrors(t *testing.T) {
	lg := slog.New(slog.DiscardHandler)
	_, err := New(Config{WorkRoot: t.TempDir()}, lg)
	require.ErrorContains(t, err, "TASKRUNNER_PROCESS_RUNNER_BIN")
	_, err = New(Config{RunnerBin: "/nonexistent/runner", WorkRoot: t.TempDir()}, lg)
	require.ErrorContains(t, err, "not an executable")
	_, err = New(Config{RunnerBin: "/bin/true", WorkRoot: t.TempDir(), Bwrap: "sometimes"}, lg)
	require.ErrorContains(t, err, "TASKRUNNER_PROCESS_BWRAP")
	_ = syscall.Getpid()
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
