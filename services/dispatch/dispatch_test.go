package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/process"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

type harness struct {
	db      *storetest.DB
	dir     string
	starts  string
	tasks   *task.Store
	ca      *pki.CA
	cancels *recordingCanceller
}

type recordingCanceller struct {
	mu  sync.Mutex
	ids []string
}

func (r *recordingCanceller) Cancel(_ context.Context, id, _ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, id)
	return nil
}

// fakeRunner stands in for the runner binary: it records its start and the
// environment it got, then sleeps (or exits at once with EXIT_AT_ONCE).
func newHarness(t *testing.T) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{db: storetest.NewDB(t), dir: dir, starts: filepath.Join(dir, "starts.txt"), cancels: &recordingCanceller{}}
	script := `#!/bin/sh
echo "$TASKRUNNER_TASK_ID" >> "` + h.starts + `"
env > "$TASKRUNNER_WORKDIR/../env.tmp" && mv "$TASKRUNNER_WORKDIR/../env.tmp" "$TASKRUNNER_WORKDIR/../env.txt"
exec sleep 300
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "runner"), []byte(script), 0o755))
	h.tasks = task.NewStore(h.db.Pool)
	ca, err := pki.NewCA("taskrunner.test", time.Hour)
	require.NoError(t, err)
	h.ca = ca
	return h
}

func (h *harness) server(t *testing.T, cfg Config, root string) *Server {
	t.Helper()
	lg := slog.New(slog.DiscardHandler)
	p, err := process.New(process.Config{RunnerBin: filepath.Join(h.dir, "runner"), WorkRoot: filepath.Join(h.dir, root), Bwrap: "never", KillGrace: time.Second}, lg)
	require.NoError(t, err)
	s, err := New(cfg, Deps{Pool: h.db.Pool, Provider: p, CA: h.ca, Canceller: h.cancels, Logger: lg,
		Getenv: func(k string) string {
			return map[string]string{"ANTHROPIC_API_KEY": "sk-ant-test", "GITHUB_TOKEN": "ghp_shouldneverpass"}[k]
		}})
	require.NoError(t, err)
	t.Cleanup(func() { h.destroyAll(t, p) })
	t.Cleanup(s.Wait) // runs first: no sandbox start is left in flight
	return s
}

func (h *harness) destroyAll(t *testing.T, p sandbox.Provider) {
	sbs, _ := p.List(context.Background(), nil)
	for _, sb := range sbs {
		_ = p.Destroy(context.Background(), sb.ID)
	}
}

func testConfig() Config {
	return Config{PerOwnerPerDay: 20, PerRepoRunning: 3, GlobalRunning: 100, TaskTimeout: time.Hour, HeartbeatInterval: time.Minute,
		ReaperInterval: time.Hour, OrphanGrace: 0, CancelGrace: 2 * time.Second, RunnerImage: "runner:test",
		RunnerEventsAddr: "127.0.0.1:7443", RunnerServerName: "localhost", MaxTurns: 10, MaxBudgetUSD: 1,
		PassEnv: []string{"ANTHROPIC_API_KEY", "GITHUB_TOKEN"}}
}

func (h *harness) create(t *testing.T, owner, repo string) string {
	t.Helper()
	tk, _, err := h.tasks.Create(context.Background(), task.NewTask{Owner: owner, Repo: repo, BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	return tk.ID
}

func (h *harness) startCount(t *testing.T) map[string]int {
	b, _ := os.ReadFile(h.starts)
	out := map[string]int{}
	for _, l := range strings.Fields(string(b)) {
		out[l]++
	}
	return out
}

func (h *harness) status(t *testing.T, id string) task.Status {
	tk, err := h.tasks.Get(context.Background(), id, "")
	require.NoError(t, err)
	return tk.Status
}

// silence makes id's runner silent for an hour: its last heartbeat and
// its run's start both that long ago.
func (h *harness) silence(t *testing.T, id string) {
	_, err := h.db.Pool.Exec(context.Background(), `UPDATE tasks SET heartbeat_at = now() - interval '1 hour', started_at = now() - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
}

func TestDispatchStartsSandboxWithRunnerEnv(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.ModelProxyAddr = "127.0.0.1:7444"
	s := h.server(t, cfg, "sb")
	id := h.create(t, "alice", "acme/widgets")
	tk, err := s.DispatchTask(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, task.StatusRunning, tk.Status)
	require.NotNil(t, tk.DeadlineAt)
	require.WithinDuration(t, time.Now().Add(time.Hour), *tk.DeadlineAt, time.Minute)

	envFile := filepath.Join(h.dir, "sb", sandbox.Name(id), "env.txt")
	var env string
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(envFile)
		env = string(b)
		return strings.Contains(env, "TASKRUNNER_MAX_BUDGET_USD=")
	}, 10*time.Second, 20*time.Millisecond)
	for _, want := range []string{"TASKRUNNER_TASK_ID=" + id, "TASKRUNNER_REPO=acme/widgets", "TASKRUNNER_BASE_BRANCH=main",
		"TASKRUNNER_EVENTS_ADDR=127.0.0.1:7443", "TASKRUNNER_AGENT=claude", "TASKRUNNER_MODEL_PROXY_ADDR=127.0.0.1:7444", "BEGIN CERTIFICATE", "PRIVATE KEY-----"} {
		require.Contains(t, env, want)
	}
	require.NotContains(t, env, "sk-ant-test", "no model key enters a sandbox, even when listed in PassEnv")
	require.NotContains(t, env, "ANTHROPIC_API_KEY")
	require.NotContains(t, env, "ghp_shouldneverpass", "no GitHub token ever enters a sandbox")
	require.NotContains(t, env, "GITHUB_TOKEN")

	// Repeated dispatch: same task, no second sandbox.
	tk2, err := s.DispatchTask(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, task.StatusRunning, tk2.Status)
	require.Equal(t, map[string]int{id: 1}, h.startCount(t))
	s.Wait() // the start records the sandbox id after the runner began
	var n int
	require.NoError(t, h.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM sandboxes WHERE task_id = $1 AND external_id <> ''`, id).Scan(&n))
	require.Equal(t, 1, n)
}

func TestOwnerQuota(t *testing.T) {
	h := newHarness(t)
	s := h.server(t, testConfig(), "sb")
	ctx := context.Background()
	for i := range 20 {
		_, err := s.DispatchTask(ctx, h.create(t, "alice", fmt.Sprintf("acme/r%d", i)))
		require.NoError(t, err)
	}
	id := h.create(t, "alice", "acme/extra")
	_, err := s.DispatchTask(ctx, id)
	require.ErrorIs(t, err, errs.ErrQuotaExceeded)
	var de *errs.Error
	require.ErrorAs(t, err, &de)
	require.Greater(t, de.RetryAfterSeconds, int64(86000), "retry after the oldest dispatch leaves the 24 h window")
	require.Equal(t, task.StatusProposing, h.status(t, id), "the refused task is unchanged")
	// The twenty runners record their start asynchronously.
	require.Eventually(t, func() bool { return len(h.startCount(t)) == 20 }, 10*time.Second, 20*time.Millisecond)
	require.Zero(t, h.startCount(t)[id], "nothing started for the 21st task")
	// Another owner is not affected.
	_, err = s.DispatchTask(ctx, h.create(t, "bob", "acme/extra"))
	require.NoError(t, err)
}

func TestRepoLimitQueuesFIFOAndStartsWhenCapacityFrees(t *testing.T) {
	h := newHarness(t)
	s := h.server(t, testConfig(), "sb")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.Listen(ctx, time.Hour) }() // no polling: only NOTIFY can wake it
	defer func() { cancel(); wg.Wait() }()

	var ids []string
	for range 5 {
		id := h.create(t, "alice", "acme/widgets")
		ids = append(ids, id)
		_, err := s.DispatchTask(context.Background(), id)
		require.NoError(t, err)
	}
	for i, id := range ids {
		want := task.StatusRunning
		if i >= 3 {
			want = task.StatusQueued
		}
		require.Equal(t, want, h.status(t, id), "task %d", i)
	}
	// Another repository still has room.
	other := h.create(t, "alice", "acme/other")
	_, err := s.DispatchTask(context.Background(), other)
	require.NoError(t, err)
	require.Equal(t, task.StatusRunning, h.status(t, other))

	// One of the three ends: the oldest queued task (ids[3]) starts by itself.
	_, _, err = h.tasks.Advance(context.Background(), ids[0], "", task.Advance{RequestID: "t", Status: task.StatusFailed, FailedReason: "x"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.status(t, ids[3]) == task.StatusRunning }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, task.StatusQueued, h.status(t, ids[4]), "FIFO: the newer one still waits")
	require.Eventually(t, func() bool { return h.startCount(t)[ids[3]] == 1 }, 10*time.Second, 20*time.Millisecond)
}

func TestTwoReplicasDispatchSameTasksOnce(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.PerOwnerPerDay, cfg.PerRepoRunning = 100, 100
	a := h.server(t, cfg, "sb-a")
	b := h.server(t, cfg, "sb-b")
	var ids []string
	for i := range 50 {
		ids = append(ids, h.create(t, "alice", fmt.Sprintf("acme/r%d", i%7)))
	}
	var wg sync.WaitGroup
	for _, s := range []*Server{a, b} {
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.DispatchTask(context.Background(), id)
				require.NoError(t, err)
			}()
		}
	}
	wg.Wait()
	require.Eventually(t, func() bool { return len(h.startCount(t)) == 50 }, 20*time.Second, 50*time.Millisecond)
	for id, n := range h.startCount(t) {
		require.Equal(t, 1, n, "task %s started %d sandboxes", id, n)
	}
	for _, id := range ids {
		require.Equal(t, task.StatusRunning, h.status(t, id))
	}
}

func TestCancelRunningTask(t *testing.T) {
	h := newHarness(t)
	s := h.server(t, testConfig(), "sb")
	ctx := context.Background()
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(ctx, id)
	require.NoError(t, err)
	s.Wait()
	sb, err := s.d.Provider.Get(ctx, sandbox.Name(id))
	require.NoError(t, err)
	require.Equal(t, sandbox.StateRunning, sb.State)

	tk, err := s.CancelTask(ctx, id, "user asked", task.UserActor("alice"))
	require.NoError(t, err)
	require.Equal(t, task.StatusCancelled, tk.Status)
	require.Equal(t, "user asked", tk.FailedReason)
	require.Equal(t, []string{id}, h.cancels.ids, "Cancel was pushed to the runner's stream first")
	_, err = s.d.Provider.Get(ctx, sandbox.Name(id))
	require.ErrorIs(t, err, sandbox.ErrNotFound, "the sandbox is gone")
	// No runner report is accepted afterwards.
	_, _, err = h.tasks.Advance(ctx, id, "", task.Advance{Seq: 99, Stage: task.StageExplore})
	require.ErrorIs(t, err, errs.ErrInvalidTransition)
}

func TestReaper(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.HeartbeatInterval = time.Second
	cfg.CancelGrace = 0
	s := h.server(t, cfg, "sb")
	ctx := context.Background()

	late := h.create(t, "alice", "acme/a")
	silent := h.create(t, "alice", "acme/b")
	healthy := h.create(t, "alice", "acme/c")
	for _, id := range []string{late, silent, healthy} {
		_, err := s.DispatchTask(ctx, id)
		require.NoError(t, err)
	}
	_, err := h.db.Pool.Exec(ctx, `UPDATE tasks SET deadline_at = now() - interval '1 minute', heartbeat_at = now() WHERE id = $1`, late)
	require.NoError(t, err)
	_, err = h.db.Pool.Exec(ctx, `UPDATE tasks SET heartbeat_at = now() - interval '10 seconds', started_at = now() - interval '20 seconds' WHERE id = $1`, silent)
	require.NoError(t, err)
	_, err = h.db.Pool.Exec(ctx, `UPDATE tasks SET heartbeat_at = now() + interval '1 hour' WHERE id = $1`, healthy)
	require.NoError(t, err)

	// A sandbox left behind by a killed Dispatch: its task finished while no
	// Dispatch was running, and the new Dispatch never saw it.
	gone := h.create(t, "alice", "acme/d")
	_, err = s.d.Provider.Create(ctx, sandbox.Spec{TaskID: gone, Owner: "alice"})
	require.NoError(t, err)
	_, _, err = h.tasks.Advance(ctx, gone, "", task.Advance{RequestID: "x", Status: task.StatusCancelled})
	require.NoError(t, err)
	restarted := h.server(t, cfg, "sb")         // a new Dispatch on the same provider state
	restarted.born = time.Now().Add(-time.Hour) // past its start-up grace (TestReaperGraceAfterStart)

	res, err := restarted.Reap(ctx)
	require.NoError(t, err)
	require.Equal(t, ReapResult{TimedOut: 1, Lost: 1, Orphans: 1}, res)

	tk, _ := h.tasks.Get(ctx, late, "")
	require.Equal(t, task.StatusFailed, tk.Status)
	require.Equal(t, "timeout", tk.FailedReason)
	tk, _ = h.tasks.Get(ctx, silent, "")
	require.Equal(t, task.StatusFailed, tk.Status)
	require.Contains(t, tk.FailedReason, "runner_lost")
	require.Equal(t, task.StatusRunning, h.status(t, healthy))
	for _, id := range []string{late, silent, gone} {
		_, err := s.d.Provider.Get(ctx, sandbox.Name(id))
		require.ErrorIs(t, err, sandbox.ErrNotFound, "sandbox of %s destroyed", id)
	}
	_, err = s.d.Provider.Get(ctx, sandbox.Name(healthy))
	require.NoError(t, err)

	// A second cycle finds nothing to do.
	res, err = restarted.Reap(ctx)
	require.NoError(t, err)
	require.Equal(t, ReapResult{}, res)
}

func TestConfigValidate(t *testing.T) {
	c := testConfig()
	c.PerRepoRunning = 0
	require.ErrorContains(t, c.Validate(), "TASKRUNNER_DISPATCH_PER_REPO_RUNNING")
	c = testConfig()
	c.RunnerEventsAddr = ""
	require.ErrorContains(t, c.Validate(), "TASKRUNNER_RUNNER_EVENTS_ADDR")
}

// cancellingProvider cancels the dispatching request's context while its
// sandbox is being created, as a client that disconnects right after its
// admission committed does, then creates the sandbox only if the context
// it was given still holds.
type cancellingProvider struct {
	sandbox.Provider
	cancel context.CancelFunc
}

func (p cancellingProvider) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	p.cancel()
	if err := ctx.Err(); err != nil {
		return sandbox.Sandbox{}, err
	}
	return p.Provider.Create(ctx, spec)
}

func TestClientDisconnectDoesNotFailAnAdmittedTask(t *testing.T) {
	h := newHarness(t)
	s := h.server(t, testConfig(), "sb")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.d.Provider = cancellingProvider{Provider: s.d.Provider, cancel: cancel}
	id := h.create(t, "alice", "acme/widgets")
	if _, err := s.DispatchTask(ctx, id); err != nil {
		require.ErrorIs(t, err, context.Canceled) // the answer may be lost with the client
	}
	s.Wait()
	require.Equal(t, task.StatusRunning, h.status(t, id), "starting the sandbox runs under no request's context")
	_, err := s.d.Provider.Get(context.Background(), sandbox.Name(id))
	require.NoError(t, err)
	require.Contains(t, h.timeline(t, id), "sandbox:started")
}

// failingProvider refuses every Create.
type failingProvider struct {
	sandbox.Provider
	calls *int
}

func (p failingProvider) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	*p.calls++
	return sandbox.Sandbox{}, errors.New("no capacity in the region")
}

func TestSandboxStartIsRetriedThenFailsOnTheTimeline(t *testing.T) {
	h := newHarness(t)
	s := h.server(t, testConfig(), "sb")
	calls := 0
	s.d.Provider = failingProvider{Provider: s.d.Provider, calls: &calls}
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(context.Background(), id)
	require.NoError(t, err)
	s.Wait()
	require.Equal(t, startAttempts, calls)
	tk, err := h.tasks.Get(context.Background(), id, "")
	require.NoError(t, err)
	require.Equal(t, task.StatusFailed, tk.Status)
	require.Contains(t, tk.FailedReason, "no capacity in the region")
	require.Equal(t, []string{"status_change:proposing", "status_change:running", "sandbox:failed", "status_change:failed"}, h.timeline(t, id))
}

func TestSandboxIsDestroyedWhenTheRunnerFinishes(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.CancelGrace = time.Hour
	s := h.server(t, cfg, "sb")
	ctx := context.Background()
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(ctx, id)
	require.NoError(t, err)
	s.Wait()
	// The runner reports its pull request: the task awaits review and the
	// runner has nothing left to do.
	_, _, err = h.tasks.Advance(ctx, id, "", task.Advance{Seq: 1, Status: task.StatusAwaitingReview, PRURL: "http://forge/acme/widgets/pull/1", PRNumber: 1, Actor: task.ActorRunner})
	require.NoError(t, err)
	s.releaseFinished(ctx)
	_, err = s.d.Provider.Get(ctx, sandbox.Name(id))
	require.NoError(t, err, "the runner gets CancelGrace to exit on its own (and flush its spans)")
	s.cfg.CancelGrace = 0
	s.releaseFinished(ctx)
	_, err = s.d.Provider.Get(ctx, sandbox.Name(id))
	require.ErrorIs(t, err, sandbox.ErrNotFound, "the sandbox of a task awaiting review is gone")
	var state string
	var destroyed *time.Time
	require.NoError(t, h.db.Pool.QueryRow(ctx, `SELECT state, destroyed_at FROM sandboxes WHERE task_id = $1`, id).Scan(&state, &destroyed))
	require.Equal(t, "destroyed", state)
	require.NotNil(t, destroyed)
	require.NoDirExists(t, filepath.Join(h.dir, "sb", sandbox.Name(id)), "per-task files go with the sandbox")
	tl := h.timeline(t, id)
	require.Equal(t, "sandbox:destroyed", tl[len(tl)-1])
}

type recordingPRs struct {
	repo    string
	number  int
	comment string
}

func (r *recordingPRs) ClosePullRequest(_ context.Context, repo string, number int, comment string) error {
	r.repo, r.number, r.comment = repo, number, comment
	return nil
}

func TestCancelAwaitingReviewClosesThePullRequest(t *testing.T) {
	h := newHarness(t)
	s := h.server(t, testConfig(), "sb")
	prs := &recordingPRs{}
	s.d.PullRequests = prs
	ctx := context.Background()
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(ctx, id)
	require.NoError(t, err)
	s.Wait()
	_, _, err = h.tasks.Advance(ctx, id, "", task.Advance{Seq: 1, Status: task.StatusAwaitingReview, PRURL: "http://forge/acme/widgets/pull/7", PRNumber: 7})
	require.NoError(t, err)

	tk, err := s.CancelTask(ctx, id, "not needed any more", task.UserActor("bob"))
	require.NoError(t, err)
	require.Equal(t, task.StatusCancelled, tk.Status)
	require.Equal(t, "acme/widgets", prs.repo)
	require.Equal(t, 7, prs.number)
	require.Contains(t, prs.comment, "cancelled by bob")
	// A later merge is refused, not silently dropped.
	_, _, err = h.tasks.Advance(ctx, id, "", task.Advance{RequestID: "merge", Status: task.StatusDone, Actor: task.ActorGitHub})
	require.ErrorIs(t, err, errs.ErrInvalidTransition)

	// Without credentials to close it, the cancel is refused and changes nothing.
	s.d.PullRequests = nil
	other := h.create(t, "alice", "acme/other")
	_, err = s.DispatchTask(ctx, other)
	require.NoError(t, err)
	s.Wait()
	_, _, err = h.tasks.Advance(ctx, other, "", task.Advance{Seq: 1, Status: task.StatusAwaitingReview, PRURL: "http://forge/acme/other/pull/8", PRNumber: 8})
	require.NoError(t, err)
	_, err = s.CancelTask(ctx, other, "x", task.UserActor("alice"))
	require.ErrorIs(t, err, errs.ErrUnavailable)
	require.Equal(t, task.StatusAwaitingReview, h.status(t, other))
}

// A follow-up run starts with the previous run's last heartbeat on the
// task, older than the silence window: the window counts from the run's
// start (MarkStarted), so the new runner has the whole of it to speak.
func TestReaperCountsSilenceFromTheRunsStart(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.HeartbeatInterval = time.Second
	s := h.server(t, cfg, "sb")
	s.born = time.Now().Add(-time.Hour) // past its start-up grace
	ctx := context.Background()
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(ctx, id)
	require.NoError(t, err)
	s.Wait()
	_, err = h.db.Pool.Exec(ctx, `UPDATE tasks SET heartbeat_at = now() - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	res, err := s.Reap(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Lost, "the run started within the window")
	require.Equal(t, task.StatusRunning, h.status(t, id))

	_, err = h.db.Pool.Exec(ctx, `UPDATE tasks SET started_at = now() - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	res, err = s.Reap(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Lost, "nothing heard for a whole window since the run started")
}

func TestReaperGraceAfterStart(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.HeartbeatInterval = time.Second
	s := h.server(t, cfg, "sb")
	ctx := context.Background()
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(ctx, id)
	require.NoError(t, err)
	s.Wait()
	h.silence(t, id)
	restarted := h.server(t, cfg, "sb")
	res, err := restarted.Reap(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Lost, "a reaper that just started waits one full window before judging silence")
	require.Equal(t, task.StatusRunning, h.status(t, id))
	restarted.born = time.Now().Add(-3 * cfg.HeartbeatInterval)
	res, err = restarted.Reap(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Lost)
	tl := h.timeline(t, id)
	require.Contains(t, tl, "status_change:failed")
}

// timeline lists a task's events as "type:detail" (the status a
// status_change moves to, a sandbox event's state).
func (h *harness) timeline(t *testing.T, id string) []string {
	t.Helper()
	rows, err := h.db.Pool.Query(context.Background(), `SELECT seq, type, coalesce(payload->'status_change'->>'to', payload->'sandbox'->>'state', '') FROM task_events WHERE task_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	var out []string
	var want int64 = 1
	for rows.Next() {
		var seq int64
		var typ, detail string
		require.NoError(t, rows.Scan(&seq, &typ, &detail))
		require.Equal(t, want, seq, "gap-free timeline")
		want++
		detail = strings.ToLower(strings.TrimPrefix(detail, "TASK_STATUS_"))
		out = append(out, typ+":"+detail)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestCreateRefusedByQuotaStoresNothing: POST /v1/tasks with dispatch:true
// over the owner's daily quota answers 429 and leaves no task behind, and
// the same idempotency key works once the quota allows it.
func TestCreateRefusedByQuotaStoresNothing(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.PerOwnerPerDay = 1
	s := h.server(t, cfg, "sb")
	lg := slog.New(slog.DiscardHandler)
	tasks := task.New(h.tasks, s, lg)
	ctx := auth.WithPrincipal(context.Background(), auth.Principal{Owner: "alice", Scopes: []string{auth.ScopeTasks}})
	req := func(key string) *taskrunnerv1.CreateTaskRequest {
		return &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "p", Dispatch: true, RequestId: key}
	}
	_, err := tasks.CreateTask(ctx, req("first"))
	require.NoError(t, err)

	_, err = tasks.CreateTask(ctx, req("second"))
	require.ErrorIs(t, err, errs.ErrQuotaExceeded)
	list, _, err := h.tasks.List(context.Background(), "alice", task.Filter{}, 100, "")
	require.NoError(t, err)
	require.Len(t, list, 1, "a refused create stores nothing")

	// The key was not burned: once the quota allows (here: a larger one),
	// the same request creates and dispatches a task.
	s.cfg.PerOwnerPerDay = 2
	resp, err := tasks.CreateTask(ctx, req("second"))
	require.NoError(t, err)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, resp.GetTask().GetStatus())
}

// followUpEnv is a task awaiting review after its first run, with a
// TaskService on the real Dispatch.
func followUpEnv(t *testing.T, cfg Config) (*harness, *Server, *task.Server, context.Context, string) {
	h := newHarness(t)
	s := h.server(t, cfg, "sb")
	tasks := task.New(h.tasks, s, slog.New(slog.DiscardHandler))
	ctx := auth.WithPrincipal(context.Background(), auth.Principal{Owner: "alice", Scopes: []string{auth.ScopeTasks}})
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(ctx, id)
	require.NoError(t, err)
	s.Wait()
	h.finishRun(t, s, id, 1)
	return h, s, tasks, ctx, id
}

// finishRun plays the runner of run n reporting its pull request.
func (h *harness) finishRun(t *testing.T, s *Server, id string, n int64) {
	t.Helper()
	_, _, err := h.tasks.Advance(context.Background(), id, "", task.Advance{Seq: 1, Status: task.StatusAwaitingReview,
		PRURL: "http://forge/acme/widgets/pull/3", PRNumber: 3, Actor: task.ActorRunner})
	require.NoError(t, err)
	s.releaseFinished(context.Background())
}

func TestFollowUpStartsANewRunOnTheSamePullRequest(t *testing.T) {
	h, s, tasks, ctx, id := followUpEnv(t, testConfig())
	resp, err := tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: id, Prompt: "Rename the flag to --bye", RequestId: "f1"})
	require.NoError(t, err)
	require.True(t, resp.GetCreated())
	require.Equal(t, int32(2), resp.GetRun().GetNumber())
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, resp.GetTask().GetStatus())
	require.Equal(t, int32(2), resp.GetTask().GetRun())
	s.Wait()
	// The new sandbox is told which run it is, the follow-up and the PR.
	var env []byte
	require.Eventually(t, func() bool {
		env, _ = os.ReadFile(filepath.Join(h.dir, "sb", sandbox.Name(id), "env.txt"))
		return strings.Contains(string(env), "TASKRUNNER_RUN=2")
	}, 20*time.Second, 50*time.Millisecond)
	for _, want := range []string{"TASKRUNNER_RUN=2", "TASKRUNNER_FOLLOWUP_PROMPT=Rename the flag to --bye", "TASKRUNNER_PR_NUMBER=3", "TASKRUNNER_PR_URL=http://forge/acme/widgets/pull/3"} {
		require.Contains(t, string(env), want)
	}
	// The same request again starts nothing.
	again, err := tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: id, Prompt: "Rename the flag to --bye", RequestId: "f1"})
	require.NoError(t, err)
	require.False(t, again.GetCreated())
	require.Equal(t, int32(2), again.GetRun().GetNumber())
	require.Eventually(t, func() bool { return h.startCount(t)[id] == 2 }, 20*time.Second, 50*time.Millisecond, "two runs, two sandboxes")
	tl := h.timeline(t, id)
	require.Contains(t, tl, "status_change:running")
	require.Equal(t, "sandbox:started", tl[len(tl)-1])

	// A follow-up while run 2 is active waits behind it…
	queued, err := tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: id, Prompt: "And document it", RequestId: "f2"})
	require.NoError(t, err)
	require.Equal(t, "pending", queued.GetRun().GetState())
	require.Equal(t, int32(2), queued.GetTask().GetRun())
	// …and starts when run 2 ends.
	h.finishRun(t, s, id, 2)
	s.startPendingRuns(context.Background())
	s.Wait()
	got, err := tasks.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id})
	require.NoError(t, err)
	require.Equal(t, int32(3), got.GetTask().GetRun())
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, got.GetTask().GetStatus())
	require.Len(t, got.GetTask().GetRuns(), 3)
	require.Equal(t, []string{"finished", "finished", "running"}, []string{got.GetTask().GetRuns()[0].GetState(), got.GetTask().GetRuns()[1].GetState(), got.GetTask().GetRuns()[2].GetState()})
}

func TestFollowUpLimitsAndRefusals(t *testing.T) {
	cfg := testConfig()
	h, s, tasks, ctx, id := followUpEnv(t, cfg)
	// Refused where there is nothing to revise.
	fresh := h.create(t, "alice", "acme/other")
	_, err := tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: fresh, Prompt: "x"})
	require.ErrorIs(t, err, errs.ErrInvalidTransition)
	_, err = tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: id, Prompt: "  "})
	require.ErrorIs(t, err, errs.ErrInvalidArgument)

	// The run limit counts every run.
	tasks.SetMaxRuns(3)
	for i := 2; i <= 3; i++ {
		_, err := tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: id, Prompt: fmt.Sprintf("change %d", i)})
		require.NoError(t, err)
		s.Wait()
		h.finishRun(t, s, id, int64(i))
	}
	_, err = tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: id, Prompt: "one more"})
	require.ErrorIs(t, err, errs.ErrInvalidTransition)
	require.ErrorContains(t, err, "3 runs")

	// Follow-ups count against the owner's daily quota: refused, nothing kept.
	s.cfg.PerOwnerPerDay = 4 // alice has started 3 runs so far
	tasks.SetMaxRuns(10)
	_, err = tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: id, Prompt: "over quota", RequestId: "q"})
	require.NoError(t, err, "3 runs started so far: the 4th fits")
	s.Wait()
	h.finishRun(t, s, id, 4)
	_, err = tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: id, Prompt: "over quota", RequestId: "q2"})
	require.ErrorIs(t, err, errs.ErrQuotaExceeded)
	got, err := tasks.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id})
	require.NoError(t, err)
	require.Len(t, got.GetTask().GetRuns(), 4, "a refused follow-up is not kept")
}
