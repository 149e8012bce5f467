package events_test

import (
	"context"
	"crypto/tls"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/task"
)

// collectChannel subscribes to a task's Redis channel and returns the seqs
// published until the terminal event.
func collectChannel(t *testing.T, e *env, taskID string) <-chan []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	ps := e.rds.Client.Subscribe(ctx, eventwire.Channel(e.rds.Prefix, taskID))
	_, err := ps.Receive(ctx)
	require.NoError(t, err)
	out := make(chan []int64, 1)
	go func() {
		defer cancel()
		defer ps.Close()
		var seqs []int64
		for m := range ps.Channel() {
			msg, err := eventwire.DecodeMessage([]byte(m.Payload))
			if err != nil {
				break
			}
			ev, err := eventwire.DecodeEvent(msg.Payload)
			if err != nil || ev.GetSeq() != msg.Seq || eventwire.TypeName(ev) != msg.Type {
				break
			}
			if ev.GetSeq() > 2 { // after created and running, the runner's
				seqs = append(seqs, ev.GetSeq()-2)
			}
			if eventwire.RunnerTerminal(ev) {
				break
			}
		}
		out <- seqs
	}()
	return out
}

func seqRange(from, to int64) []int64 {
	var s []int64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestRunnerStreamsEveryEventOnce(t *testing.T) {
	cases := []struct {
		name  string
		n     int
		last  *taskrunnerv1.Event
		check func(t *testing.T, tk task.Task)
	}{
		{
			name: "completed", n: 300, last: completed("https://github.com/acme/widgets/pull/7", 7),
			check: func(t *testing.T, tk task.Task) {
				require.Equal(t, task.StatusAwaitingReview, tk.Status)
				require.Equal(t, "https://github.com/acme/widgets/pull/7", tk.PRURL)
				require.Equal(t, int64(7), tk.PRNumber)
				require.Empty(t, tk.FailedReason)
			},
		},
		{
			name: "failed", n: 200, last: failed("agent crashed holding ghp_abcdefghijklmnopqrstuvwxyz0123456789", "https://github.com/acme/widgets/pull/9"),
			check: func(t *testing.T, tk task.Task) {
				require.Equal(t, task.StatusFailed, tk.Status)
				require.Equal(t, "agent crashed holding [REDACTED]", tk.FailedReason)
				require.Equal(t, "https://github.com/acme/widgets/pull/9", tk.PRURL)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			in := e.start(t, "127.0.0.1:0")
			id := e.runningTask(t, "alice")
			published := collectChannel(t, e, id)
			evs, lastDiff := workload(tc.n, tc.last)
			c := e.runner(t, in.addr, id)
			for i, ev := range evs {
				seq, err := c.Send(ev)
				require.NoError(t, err)
				require.Equal(t, int64(i+1), seq)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, c.Close(ctx))
			require.Equal(t, int64(tc.n), c.Acked())

			n, distinct, lo, hi := e.storedSeqs(t, id)
			require.Equal(t, [4]int64{int64(tc.n), int64(tc.n), 1, int64(tc.n)}, [4]int64{n, distinct, lo, hi})
			var stages, terminal int
			require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE type = 'stage_change'), count(*) FILTER (WHERE type = $2)
				FROM task_events WHERE task_id = $1`, id, eventwire.TypeName(tc.last)).Scan(&stages, &terminal))
			require.Equal(t, 4, stages)
			require.Equal(t, 1, terminal)
			tk := e.task(t, id)
			require.Equal(t, task.StageArchive, tk.Stage)
			require.Equal(t, task.DiffStats{Additions: lastDiff[0], Deletions: lastDiff[1], FilesChanged: lastDiff[2]}, tk.Diff)
			require.Positive(t, tk.Usage.TokensIn)
			tc.check(t, tk)

			select {
			case seqs := <-published:
				require.Equal(t, seqRange(1, int64(tc.n)), seqs, "Redis got every event once, in order")
			case <-time.After(30 * time.Second):
				t.Fatal("the terminal event was never published")
			}
		})
	}
}

// TestShardedCommittersKeepEachTaskInOrder streams several tasks at once
// through a replica with three committers: each task's events are stored
// exactly once and published in order, whichever committer holds them.
func TestShardedCommittersKeepEachTaskInOrder(t *testing.T) {
	e := newEnv(t)
	e.committers = 3
	in := e.start(t, "127.0.0.1:0")
	const tasks, n = 6, 150
	var wg sync.WaitGroup
	for range tasks {
		id := e.runningTask(t, "alice")
		published := collectChannel(t, e, id)
		c := e.runner(t, in.addr, id)
		wg.Go(func() {
			evs, _ := workload(n, completed("https://github.com/acme/widgets/pull/1", 1))
			for _, ev := range evs {
				if _, err := c.Send(ev); err != nil {
					t.Error(err)
					return
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := c.Close(ctx); err != nil {
				t.Error(err)
				return
			}
			select {
			case seqs := <-published:
				if !slices.Equal(seqRange(1, n), seqs) {
					t.Errorf("task %s: published %v, want 1..%d in order", id, seqs, n)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("task %s: the terminal event was never published", id)
			}
			if got, distinct, lo, hi := e.storedSeqs(t, id); [4]int64{got, distinct, lo, hi} != [4]int64{n, n, 1, n} {
				t.Errorf("task %s: stored %d events (%d distinct, %d..%d), want 1..%d once", id, got, distinct, lo, hi, n)
			}
		})
	}
	wg.Wait()
}

func TestInterruptedStreamLosesNothing(t *testing.T) {
	const n = 400
	cases := []struct {
		name string
		// interrupt breaks the runner's connection and returns the address
		// the runner dials.
		setup func(t *testing.T, e *env) (addr string, interrupt func())
	}{
		{
			name: "connection cut",
			setup: func(t *testing.T, e *env) (string, func()) {
				in := e.start(t, "127.0.0.1:0")
				p := newProxy(t, in.addr)
				return p.addr(), func() { require.Equal(t, 1, p.cut()) }
			},
		},
		{
			name: "server restarted",
			setup: func(t *testing.T, e *env) (string, func()) {
				in := e.start(t, "127.0.0.1:0")
				addr := in.addr
				return addr, func() {
					in.stop()
					in = e.start(t, addr)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			addr, interrupt := tc.setup(t, e)
			id := e.runningTask(t, "alice")
			published := collectChannel(t, e, id)
			evs, _ := workload(n, completed("https://github.com/acme/widgets/pull/1", 1))
			c := e.runner(t, addr, id)
			// Interrupt twice, each time with events in flight.
			for i, ev := range evs {
				_, err := c.Send(ev)
				require.NoError(t, err)
				if i == n/3 || i == 2*n/3 {
					require.Eventually(t, func() bool { return c.Acked() >= int64(i-20) }, 20*time.Second, time.Millisecond)
					interrupt()
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, c.Close(ctx))
			nRows, distinct, lo, hi := e.storedSeqs(t, id)
			require.Equal(t, [4]int64{n, n, 1, n}, [4]int64{nRows, distinct, lo, hi})
			require.Equal(t, task.StatusAwaitingReview, e.task(t, id).Status)
			select {
			case seqs := <-published:
				require.Equal(t, seqRange(1, n), seqs, "nothing published twice or lost")
			case <-time.After(30 * time.Second):
				t.Fatal("the terminal event was never published")
			}
		})
	}
}

func TestRefusedEventChangesNothing(t *testing.T) {
	explore := func() *taskrunnerv1.Event { return stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE) }
	apply := func() *taskrunnerv1.Event { return stage(taskrunnerv1.TaskStage_TASK_STAGE_APPLY) }
	cases := []struct {
		name    string
		prefix  []*taskrunnerv1.Event
		bad     *taskrunnerv1.Event
		badSeq  int64 // 0: next
		message string
	}{
		{name: "stage backward", prefix: []*taskrunnerv1.Event{explore(), apply()}, bad: stage(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE), message: "stages only move forward"},
		{name: "same stage again", prefix: []*taskrunnerv1.Event{explore()}, bad: explore(), message: "stages only move forward"},
		{name: "log after completed", prefix: []*taskrunnerv1.Event{explore(), completed("https://github.com/acme/widgets/pull/2", 2)}, bad: logLine("late"), message: "after its terminal event"},
		{name: "stage after failed", prefix: []*taskrunnerv1.Event{explore(), failed("boom", "")}, bad: apply(), message: "after its terminal event"},
		{name: "completed after cancelled", prefix: []*taskrunnerv1.Event{{Payload: &taskrunnerv1.Event_Cancelled{Cancelled: &taskrunnerv1.Cancelled{Reason: "user"}}}}, bad: completed("https://x/pull/3", 3), message: "after its terminal event"},
		{name: "completed without a PR", prefix: []*taskrunnerv1.Event{explore()}, bad: completed("", 0), message: "without a pull request"},
		{name: "gap", prefix: []*taskrunnerv1.Event{explore()}, bad: logLine("skipped one"), badSeq: 3, message: "without gaps"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			in := e.start(t, "127.0.0.1:0")
			id := e.runningTask(t, "alice")
			stream, w, err := rawStream(t, in.addr, e.runnerTLS(t, e.ca, id, time.Now().Add(time.Hour)), id, taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1)
			require.NoError(t, err)
			require.Equal(t, int64(0), w.GetLastPersistedSeq())
			for i, ev := range tc.prefix {
				sendEvent(t, stream, int64(i+1), ev)
			}
			for acked := int64(0); acked < int64(len(tc.prefix)); {
				m, err := stream.Recv()
				require.NoError(t, err)
				acked = m.GetAck().GetSeq()
			}
			before := e.task(t, id)
			rowsBefore := e.totalRows(t)

			seq := tc.badSeq
			if seq == 0 {
				seq = int64(len(tc.prefix) + 1)
			}
			sendEvent(t, stream, seq, tc.bad)
			_, err = stream.Recv()
			require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.message)
			require.Equal(t, rowsBefore, e.totalRows(t))
			require.Equal(t, before, e.task(t, id))
		})
	}
}

func TestRedeliveryIsAckedAndIgnored(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	cfg := e.runnerTLS(t, e.ca, id, time.Now().Add(time.Hour))
	stream, _, err := rawStream(t, in.addr, cfg, id, taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1)
	require.NoError(t, err)
	sendEvent(t, stream, 1, stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE))
	sendEvent(t, stream, 2, logLine("original"))
	for acked := int64(0); acked < 2; {
		m, err := stream.Recv()
		require.NoError(t, err)
		acked = m.GetAck().GetSeq()
	}
	// A second stream (the runner reconnected) hears where to resume and
	// may resend what it is unsure about.
	stream2, w, err := rawStream(t, in.addr, cfg, id, taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1)
	require.NoError(t, err)
	require.Equal(t, int64(2), w.GetLastPersistedSeq())
	sendEvent(t, stream2, 2, logLine("resent with other text"))
	m, err := stream2.Recv()
	require.NoError(t, err)
	require.Equal(t, int64(2), m.GetAck().GetSeq())
	recs, err := in.srv.Store().ListAfter(context.Background(), id, 2, 10) // after created and running
	require.NoError(t, err)
	require.Len(t, recs, 2)
	ev, err := eventwire.DecodeEvent(recs[1].Payload)
	require.NoError(t, err)
	require.Equal(t, []string{"original"}, ev.GetLog().GetLines())
}

func TestConnectRefusesWrongIdentity(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	taskA := e.runningTask(t, "alice")
	taskB := e.runningTask(t, "alice")
	done := e.runningTask(t, "alice")
	// Cancelled: a task the control plane failed still takes its late
	// runner (TestSalvagedPullRequestIsRecordedOnAFailedTask).
	_, _, err := e.tasks.Advance(context.Background(), done, "", task.Advance{Status: task.StatusCancelled, FailedReason: "user", RequestID: "cancel"})
	require.NoError(t, err)
	otherCA, err := pki.NewCA(trustDomain, time.Hour)
	require.NoError(t, err)
	otherDomainCA, err := pki.NewCA("elsewhere.dev", time.Hour)
	require.NoError(t, err)
	valid := time.Now().Add(time.Hour)

	cases := []struct {
		name     string
		cfg      func() *tls.Config
		hello    string
		version  taskrunnerv1.ProtocolVersion
		wantCode []codes.Code
		wantMsg  string
	}{
		{name: "no client certificate", hello: taskA, wantCode: []codes.Code{codes.Unauthenticated}, wantMsg: "client certificate",
			cfg: func() *tls.Config { c := e.runnerTLS(t, e.ca, taskA, valid); c.Certificates = nil; return c }},
		// Either the TLS handshake fails (the connection never carries a
		// call), or the Go client, seeing that its certificate's issuer is
		// not among the CAs the server asks for, sends none.
		{name: "certificate from another CA", hello: taskA, wantCode: []codes.Code{codes.Unavailable, codes.Unauthenticated},
			cfg: func() *tls.Config { return e.runnerTLS(t, otherCA, taskA, valid) }},
		{name: "certificate of another trust domain's CA", hello: taskA, wantCode: []codes.Code{codes.Unavailable, codes.Unauthenticated},
			cfg: func() *tls.Config { return e.runnerTLS(t, otherDomainCA, taskA, valid) }},
		{name: "expired certificate", hello: taskA, wantCode: []codes.Code{codes.Unavailable},
			cfg: func() *tls.Config { return e.runnerTLS(t, e.ca, taskA, time.Now().Add(-30*time.Second)) }},
		{name: "certificate for A, Hello for B", hello: taskB, wantCode: []codes.Code{codes.PermissionDenied}, wantMsg: "Hello names task",
			cfg: func() *tls.Config { return e.runnerTLS(t, e.ca, taskA, valid) }},
		{name: "finished task", hello: done, wantCode: []codes.Code{codes.FailedPrecondition}, wantMsg: "is cancelled",
			cfg: func() *tls.Config { return e.runnerTLS(t, e.ca, done, valid) }},
		{name: "unknown protocol version", hello: taskA, version: 7, wantCode: []codes.Code{codes.FailedPrecondition},
			wantMsg: "runner protocol version 7 not supported, server speaks 1",
			cfg:     func() *tls.Config { return e.runnerTLS(t, e.ca, taskA, valid) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			version := tc.version
			if version == 0 {
				version = taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1
			}
			before := map[string]task.Task{taskA: e.task(t, taskA), taskB: e.task(t, taskB), done: e.task(t, done)}
			stream, _, err := rawStream(t, in.addr, tc.cfg(), tc.hello, version)
			if err == nil {
				// Never reached in a passing test; try to write anyway.
				sendEvent(t, stream, 1, stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE))
				_, err = stream.Recv()
			}
			require.Error(t, err)
			require.Contains(t, tc.wantCode, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.wantMsg)
			require.Equal(t, int64(0), e.totalRows(t))
			for id, tk := range before {
				require.Equal(t, tk, e.task(t, id))
			}
		})
	}
}

func TestCancelReachesTheRunnerThroughAnotherReplica(t *testing.T) {
	e := newEnv(t)
	one := e.start(t, "127.0.0.1:0")
	two := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	c := e.runner(t, one.addr, id)
	_, err := c.Send(stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.Acked() == 1 }, 10*time.Second, time.Millisecond)

	require.NoError(t, two.srv.Cancel(context.Background(), id, "user pressed stop"))
	select {
	case reason := <-c.Cancelled():
		require.Equal(t, "user pressed stop", reason)
	case <-time.After(10 * time.Second):
		t.Fatal("Cancel never reached the runner")
	}
	_, err = c.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Cancelled{Cancelled: &taskrunnerv1.Cancelled{Reason: "user pressed stop"}}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Close(ctx))
	tk := e.task(t, id)
	require.Equal(t, task.StatusCancelled, tk.Status)
	require.Equal(t, "user pressed stop", tk.FailedReason)
}

func TestClientFinishesWhenFinalEventWasStoredButNotAcked(t *testing.T) {
	// The runner's failed event is stored, then the connection breaks before
	// the Ack: the reconnect is refused (the task is finished) but tells the
	// runner that everything is stored, so Close succeeds.
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	cfg := e.runnerTLS(t, e.ca, id, time.Now().Add(time.Hour))
	stream, _, err := rawStream(t, in.addr, cfg, id, taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1)
	require.NoError(t, err)
	sendEvent(t, stream, 1, stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE))
	sendEvent(t, stream, 2, failed("boom", ""))
	for acked := int64(0); acked < 2; {
		m, err := stream.Recv()
		require.NoError(t, err)
		acked = m.GetAck().GetSeq()
	}
	c, err := eventsclient.New(eventsclient.Config{Addr: in.addr, TLS: cfg, TaskID: id, MinBackoff: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.Start(ctx)
	for _, ev := range []*taskrunnerv1.Event{stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE), failed("boom", "")} {
		_, err := c.Send(ev)
		require.NoError(t, err)
	}
	require.NoError(t, c.Close(ctx))
	require.Equal(t, codes.FailedPrecondition, status.Code(c.Err()))
	n, _, _, _ := e.storedSeqs(t, id)
	require.Equal(t, int64(2), n)
}
