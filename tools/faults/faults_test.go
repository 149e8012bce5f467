package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
	"github.com/taskrunner/taskrunner/services/task"
)

// stream sends n log events of size bytes through c, one every gap, and
// returns once they are all handed to the client (not acknowledged).
func stream(t testing.TB, c *eventsclient.Client, from, n, size int, gap time.Duration) {
	for i := from; i < from+n; i++ {
		_, err := c.Send(logEvent(i, size))
		require.NoError(t, err)
		if gap > 0 {
			<-time.After(gap) // the pace of the runner's output, not a wait for a result
		}
	}
}

// finish sends completed and waits for the task to await review with its PR.
func finish(t testing.TB, s *stack, c *eventsclient.Client, id, pr string) {
	_, err := c.Send(completed(pr))
	require.NoError(t, err)
	require.Eventually(t, func() bool { tk := s.task(id); return tk.Status == task.StatusAwaitingReview && tk.PRURL == pr },
		30*time.Second, 10*time.Millisecond, "task %s never reached awaiting_review; it is %s", id, s.task(id).Status)
}

// subscribeAll reads a task's Subscribe stream from 0 until want events (the
// gRPC stream the gateway's SSE relays) and returns their seqs.
func subscribeAll(t testing.TB, s *stack, id string, want int64) []int64 {
	c, ctx := s.client()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := c.Subscribe(ctx, &taskrunnerv1.SubscribeRequest{TaskId: id})
	require.NoError(t, err)
	var seqs []int64
	var last *taskrunnerv1.Event
	for int64(len(seqs)) < want {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			// A stream ends at the final status change; what Dispatch
			// appends after it (the sandbox's end) is not streamed.
			sc := last.GetStatusChange()
			require.NotNil(t, sc, "the stream ended before its final event")
			require.Contains(t, []taskrunnerv1.TaskStatus{taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, taskrunnerv1.TaskStatus_TASK_STATUS_DONE,
				taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED}, sc.GetTo())
			return seqs
		}
		require.NoError(t, err)
		last = m.GetEvent()
		seqs = append(seqs, last.GetSeq())
	}
	return seqs
}

// checkTask asserts the end state every scenario shares: runner events
// stored once each, a gap-free timeline, ListEvents and Subscribe equal to
// it.
// (Dispatch may still append the sandbox's end after the task finished: the
// comparison is up to what ListEvents returned.)
func checkTask(t testing.TB, s *stack, id string, runnerEvents int64) int64 {
	c, ctx := s.client()
	listed, _ := listAll(t, c, ctx, id)
	n := int64(len(listed))
	require.Equal(t, seqRange(1, n), listed, "events:list of %s", id)
	require.GreaterOrEqual(t, s.timeline(id, runnerEvents), n)
	streamed := subscribeAll(t, s, id, n)
	require.NotEmpty(t, streamed)
	require.Equal(t, seqRange(1, int64(len(streamed))), streamed, "the stream of %s", id)
	return n
}

// PostgreSQL stopped for 10 s while two runners stream: Events answers
// Unavailable (never Internal, with a retry delay), the runners keep their
// events and resend them, nothing is lost or duplicated, both tasks end
// awaiting_review.
func TestPostgresStoppedTenSecondsDuringStreaming(t *testing.T) {
	s := newStack(t)
	gw := s.gateway()
	ids := []string{s.runningTask(time.Hour), s.runningTask(time.Hour)}
	runners := []*eventsclient.Client{s.runner(ids[0]), s.runner(ids[1])}
	const before, during, after = 40, 40, 40
	var wg sync.WaitGroup
	for _, c := range runners {
		wg.Add(1)
		go func() { defer wg.Done(); stream(t, c, 0, before, 200, 5*time.Millisecond) }()
	}
	wg.Wait()
	for _, c := range runners {
		require.Eventually(t, func() bool { return c.Acked() == before }, 20*time.Second, 5*time.Millisecond)
	}

	s.pg.stop()
	down := time.Now()
	for _, c := range runners {
		wg.Add(1)
		go func() { defer wg.Done(); stream(t, c, before, during, 200, 50*time.Millisecond) }()
	}
	// While it is down, a reader gets Unavailable with a retry delay.
	client, ctx := s.client()
	var st *status.Status
	require.Eventually(t, func() bool {
		_, err := client.ListEvents(ctx, &taskrunnerv1.ListEventsRequest{TaskId: ids[0]})
		st, _ = status.FromError(err)
		return err != nil
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, codes.Unavailable, st.Code(), "%v", st.Err())
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	require.NotNil(t, retry, "Unavailable carries RetryInfo")
	// And over REST: 503 with Retry-After, not 500.
	resp, body := s.get(gw + "/v1/tasks/" + ids[0] + "/events:list?page_size=1000")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	t.Logf("during the outage: gRPC %s with RetryInfo %s; REST %d, Retry-After %s", st.Code(), retry.GetRetryDelay().AsDuration(), resp.StatusCode, resp.Header.Get("Retry-After"))
	wg.Wait()
	<-time.After(time.Until(down.Add(10 * time.Second))) // the outage lasts 10 s
	for _, c := range runners {
		require.EqualValues(t, before, c.Acked(), "nothing is acknowledged while the database is down")
	}
	s.pg.start()
	up := time.Now()
	for _, c := range runners {
		require.Eventually(t, func() bool { return c.Acked() == before+during }, 30*time.Second, 5*time.Millisecond)
	}
	t.Logf("PostgreSQL 10 s outage: all %d buffered events of 2 runners stored %.2f s after PostgreSQL was back", during, time.Since(up).Seconds())
	for i, c := range runners {
		stream(t, c, before+during, after, 200, 0)
		finish(t, s, c, ids[i], "https://github.com/acme/widgets/pull/1")
		n := checkTask(t, s, ids[i], before+during+after+1)
		t.Logf("task %d: %d runner events, timeline of %d, status %s", i, before+during+after+1, n, s.task(ids[i]).Status)
	}
}

// taskrunnerd killed (-9) while runners stream and restarted 5 s later:
// runners reconnect, resend, and no task is failed runner_lost.
func TestEventsKilledDuringStreaming(t *testing.T) {
	s := newStack(t)
	const tasks = 5
	var ids []string
	var runners []*eventsclient.Client
	for range tasks {
		id := s.runningTask(time.Hour)
		ids = append(ids, id)
		runners = append(runners, s.runner(id))
	}
	var wg sync.WaitGroup
	for _, c := range runners {
		wg.Add(1)
		go func() { defer wg.Done(); stream(t, c, 0, 60, 300, 5*time.Millisecond) }()
	}
	<-time.After(150 * time.Millisecond) // mid-stream
	s.kill()
	wg.Wait()
	for _, c := range runners {
		stream(t, c, 60, 20, 300, 0) // buffered while Events is down
	}
	<-time.After(5 * time.Second) // the outage
	up := s.start()
	var worst time.Duration
	for i, c := range runners {
		require.Eventually(t, func() bool { return c.Acked() == 80 }, 30*time.Second, 5*time.Millisecond,
			"runner %d: acked %d, pending %d, err %v, task %+v\n%s", i, c.Acked(), c.Pending(), c.Err(), s.task(ids[i]), s.logTail())
		worst = max(worst, time.Since(up))
	}
	t.Logf("kill -9 Events, 5 s down: every runner's 80 events stored %.2f s after taskrunnerd listened again", worst.Seconds())
	for i, c := range runners {
		finish(t, s, c, ids[i], "https://github.com/acme/widgets/pull/2")
		checkTask(t, s, ids[i], 81)
	}
}

// A task of 256 events and more than 5 MB is replayed from 0 through
// ListEvents at the largest page size (never ResourceExhausted) and
// Subscribe.
func TestFiveMegabyteTaskReplayedFromZero(t *testing.T) {
	s := newStack(t)
	id := s.runningTask(time.Hour)
	c := s.runner(id)
	stream(t, c, 0, 255, 21_000, 0)
	finish(t, s, c, id, "https://github.com/acme/widgets/pull/3")
	var bytes int64
	require.NoError(t, s.pool.QueryRow(context.Background(), `SELECT sum(octet_length(payload::text)) FROM task_events WHERE task_id = $1`, id).Scan(&bytes))
	require.Greater(t, bytes, int64(5<<20))
	began := time.Now()
	client, ctx := s.client()
	seqs, pages := listAll(t, client, ctx, id)
	n := s.timeline(id, 256)
	require.Equal(t, seqRange(1, n), seqs)
	t.Logf("5 MB task: %d events, %d bytes, events:list in %d pages (%.2f s); Subscribe from 0:", n, bytes, pages, time.Since(began).Seconds())
	began = time.Now()
	require.Equal(t, seqRange(1, n), subscribeAll(t, s, id, n))
	t.Logf("  replayed in %.2f s", time.Since(began).Seconds())
}

// The deadline passes while taskrunnerd is down; the runner salvages its
// work into a draft PR and reports failed{pr_url}. After the restart the
// task is failed (by the reaper or the runner, whichever is first) and
// carries the PR.
func TestDeadlinePassedWhileDownKeepsTheSalvagedPR(t *testing.T) {
	s := newStack(t)
	id := s.runningTask(time.Hour)
	c := s.runner(id)
	stream(t, c, 0, 10, 100, 0)
	require.Eventually(t, func() bool { return c.Acked() == 10 }, 20*time.Second, 5*time.Millisecond)
	s.kill()
	_, err := s.pool.Exec(context.Background(), `UPDATE tasks SET deadline_at = now() - interval '10 minutes' WHERE id = $1`, id)
	require.NoError(t, err)
	const pr = "https://github.com/acme/widgets/pull/4"
	_, err = c.Send(logEvent(10, 100))
	require.NoError(t, err)
	_, err = c.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: "deadline exceeded: draft pull request opened", PrUrl: pr, PrNumber: 4}}})
	require.NoError(t, err)
	up := s.start()
	require.Eventually(t, func() bool { tk := s.task(id); return tk.Status == task.StatusFailed && tk.PRURL == pr },
		30*time.Second, 5*time.Millisecond, "task is %+v", s.task(id))
	require.Eventually(t, func() bool { return c.Acked() == 12 }, 20*time.Second, 5*time.Millisecond)
	tk := s.task(id)
	t.Logf("restart past a deadline: failed (%q) with the draft PR %.2f s after the restart", tk.FailedReason, time.Since(up).Seconds())
	s.timeline(id, 12)
}

// Redis stopped for 5 s while a runner streams: commits do not need Redis,
// so acknowledgements go on; subscribers lose their live feed (Subscribe
// ends Unavailable) and a new Subscribe after Redis is back replays
// everything from PostgreSQL.
func TestRedisStoppedFiveSeconds(t *testing.T) {
	s := newStack(t)
	id := s.runningTask(time.Hour)
	c := s.runner(id)
	stream(t, c, 0, 20, 200, 0)
	require.Eventually(t, func() bool { return c.Acked() == 20 }, 20*time.Second, 5*time.Millisecond)
	s.rds.stop()
	down := time.Now()
	stream(t, c, 20, 30, 200, 10*time.Millisecond)
	require.Eventually(t, func() bool { return c.Acked() == 50 }, 20*time.Second, 5*time.Millisecond,
		"events are stored while Redis is down")
	t.Logf("Redis down: 30 events acknowledged within %.2f s of the outage's start", time.Since(down).Seconds())
	<-time.After(time.Until(down.Add(5 * time.Second))) // the outage lasts 5 s
	s.rds.start()
	up := time.Now()
	stream(t, c, 50, 10, 200, 0)
	finish(t, s, c, id, "https://github.com/acme/widgets/pull/5")
	n := checkTask(t, s, id, 61)
	t.Logf("Redis 5 s outage: %d events, nothing lost; whole timeline readable and streamed %.2f s after Redis returned", n, time.Since(up).Seconds())
}

// taskrunnerd killed (-9) while 10 tasks are being dispatched: some were
// admitted and committed without their sandbox being created. After the
// restart (and the client retrying its DispatchTask calls, which are
// idempotent) every task runs in exactly one sandbox: none started twice,
// none stuck in 'creating'.
func TestRestartDuringDispatchOfTenTasks(t *testing.T) {
	s := newStack(t, func(s *stack) { s.heartbeat = time.Minute }) // the sandboxes' runners never talk
	ctx := context.Background()
	var ids []string
	for i := range 10 {
		tk, _, err := s.tasks.Create(ctx, task.NewTask{Owner: "alice", Repo: fmt.Sprintf("acme/r%d", i), BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
		require.NoError(t, err)
		ids = append(ids, tk.ID)
	}
	client, cctx := s.taskClient()
	first := make(chan struct{}, len(ids))
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := client.DispatchTask(cctx, &taskrunnerv1.DispatchTaskRequest{Id: id})
			if err == nil {
				first <- struct{}{}
			}
		}()
	}
	<-first
	s.kill() // while the others are being admitted or started
	wg.Wait()
	var admittedNotStarted int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM sandboxes WHERE state = 'creating' AND external_id = ''`).Scan(&admittedNotStarted))
	up := s.start()
	for _, id := range ids { // the client retries what it did not see succeed
		require.Eventually(t, func() bool {
			_, err := client.DispatchTask(cctx, &taskrunnerv1.DispatchTaskRequest{Id: id})
			return err == nil
		}, 20*time.Second, 20*time.Millisecond)
	}
	require.Eventually(t, func() bool {
		var creating, running int
		_ = s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'creating'), count(*) FILTER (WHERE state <> 'creating' AND external_id <> '')
			FROM sandboxes WHERE task_id = ANY($1::uuid[])`, ids).Scan(&creating, &running)
		return creating == 0 && running == len(ids) && len(s.starts()) >= len(ids)
	}, 30*time.Second, 10*time.Millisecond, "sandboxes: %v", s.starts())
	t.Logf("restart during dispatch of 10: %d admitted without a sandbox at the kill; all 10 running %.2f s after the restart", admittedNotStarted, time.Since(up).Seconds())
	starts := s.starts()
	require.Len(t, starts, len(ids), "no task started twice: %v", starts)
	for _, id := range ids {
		require.Contains(t, starts, id)
		require.Equal(t, task.StatusRunning, s.task(id).Status)
	}
}

// A runner killed mid-task: the reaper fails the task runner_lost after
// three heartbeat intervals of silence; what the runner had acknowledged is
// all there.
func TestRunnerKilled(t *testing.T) {
	s := newStack(t)
	id := s.runningTask(time.Hour)
	c, kill := s.killableRunner(id)
	stream(t, c, 0, 30, 200, 0)
	require.Eventually(t, func() bool { return c.Acked() == 30 }, 20*time.Second, 5*time.Millisecond)
	kill()
	killed := time.Now()
	require.Eventually(t, func() bool { return s.task(id).Status == task.StatusFailed }, 30*time.Second, 20*time.Millisecond)
	tk := s.task(id)
	require.Contains(t, tk.FailedReason, "runner_lost")
	n := checkTask(t, s, id, 30)
	t.Logf("runner killed: failed runner_lost %.2f s later (window %s); %d events on the timeline", time.Since(killed).Seconds(), 3*s.heartbeat, n)
}

// taskrunnerd down 40 s across the end of a task: the runner finishes its
// work (completed with its PR) while nobody listens, keeps it, and
// delivers it after the restart; the reaper (which waits a silence window
// after its start) does not fail the task first: it ends awaiting_review
// with its PR.
func TestFortySecondOutageAcrossCompletion(t *testing.T) {
	s := newStack(t)
	ids := []string{s.runningTask(time.Hour), s.runningTask(time.Hour)}
	var runners []*eventsclient.Client
	for _, id := range ids {
		c := s.runner(id)
		runners = append(runners, c)
		stream(t, c, 0, 20, 200, 0)
		require.Eventually(t, func() bool { return c.Acked() == 20 }, 20*time.Second, 5*time.Millisecond)
	}
	s.kill()
	down := time.Now()
	const pr = "https://github.com/acme/widgets/pull/6"
	for _, c := range runners {
		stream(t, c, 20, 60, 300, 0)
		_, err := c.Send(completed(pr))
		require.NoError(t, err)
	}
	<-time.After(time.Until(down.Add(40 * time.Second))) // the outage
	up := s.start()
	for i, id := range ids {
		require.Eventually(t, func() bool { tk := s.task(id); return tk.Status == task.StatusAwaitingReview && tk.PRURL == pr },
			30*time.Second, 10*time.Millisecond, "task %d is %+v", i, s.task(id))
	}
	t.Logf("40 s outage across completion: both tasks awaiting_review with their PR %.2f s after the restart", time.Since(up).Seconds())
	for i, id := range ids {
		c := runners[i] // the ack follows the commit the status showed
		require.Eventually(t, func() bool { return c.Acked() == 81 }, 10*time.Second, 5*time.Millisecond)
		checkTask(t, s, id, 81)
	}
}

// A 100 KB log burst (one agent turn of three long text blocks, and more):
// the runner's client splits it under Events' 64 KiB limit, nothing is
// refused, every line arrives in order, and the task completes.
func TestHundredKilobyteLogBurst(t *testing.T) {
	s := newStack(t)
	id := s.runningTask(time.Hour)
	c := s.runner(id)
	var lines []string
	for i := range 50 {
		lines = append(lines, fmt.Sprintf("%03d ", i)+strings.Repeat("y", 1996))
	}
	lines = append(lines, strings.Repeat("z", 30_000)) // one long text block
	_, err := c.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: lines}}})
	require.NoError(t, err)
	finish(t, s, c, id, "https://github.com/acme/widgets/pull/7")
	require.NoError(t, c.Err())

	var got []string
	var biggest int
	rows, err := s.pool.Query(context.Background(), `SELECT payload::text, payload FROM task_events WHERE task_id = $1 AND type = 'log' ORDER BY seq`, id)
	require.NoError(t, err)
	for rows.Next() {
		var text string
		var ev struct {
			Log struct{ Lines []string } `json:"log"`
		}
		require.NoError(t, rows.Scan(&text, &ev))
		biggest = max(biggest, len(text))
		got = append(got, ev.Log.Lines...)
	}
	require.NoError(t, rows.Err())
	require.Less(t, biggest, 64<<10)
	require.Equal(t, lines, got, "every line, in order, whole")
	runnerEvents := int64(c.Acked())
	n := checkTask(t, s, id, runnerEvents)
	t.Logf("100 KB log burst: %d KB in %d log events (largest %d bytes), timeline of %d, %s", len(strings.Join(lines, ""))/1000, len(got)*0+int(runnerEvents-1), biggest, n, s.task(id).Status)
}
