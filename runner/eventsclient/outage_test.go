package eventsclient_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
)

// TestSurvivesServiceKills kills the Events service three times (every connection cut, port
// closed) while runners keep sending, starts it again on the same port, and checks that every
// runner is back within 2 s of the port reopening (the operator measured 2.5–11.8 s) and that
// the server ends up with every event exactly once, in order.
func TestSurvivesServiceKills(t *testing.T) {
	const runners, perPhase = 10, 30
	svc := newEventsServer()
	ts := startTCP(t, svc)
	clients := make([]*eventsclient.Client, runners)
	for i := range clients {
		clients[i] = ts.client(t, fmt.Sprintf("task-%d", i), eventsclient.Config{SpillDir: t.TempDir()})
	}
	var want [runners][]string
	send := func(phase int) {
		for i, c := range clients {
			for k := range perPhase {
				line := fmt.Sprintf("runner %d phase %d line %d", i, phase, k)
				_, err := c.Send(logLine(line))
				require.NoError(t, err)
				want[i] = append(want[i], line)
			}
		}
	}
	for _, c := range clients {
		select {
		case <-c.Connected():
		case <-time.After(10 * time.Second):
			t.Fatal("a runner never connected")
		}
	}
	send(0)
	var worst time.Duration
	for phase, outage := range []time.Duration{300 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second} {
		ts.kill()
		send(2*phase + 1) // buffered while the service is down
		<-time.After(outage)
		ts.start()
		back := time.Now()
		for i := range clients {
			task := fmt.Sprintf("task-%d", i)
			var reconnect time.Duration
			require.Eventually(t, func() bool {
				for _, h := range svc.helloTimes(task) {
					if h.After(back) {
						reconnect = h.Sub(back)
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond, "runner %d did not come back after outage %d", i, phase)
			worst = max(worst, reconnect)
		}
		send(2*phase + 2)
	}
	t.Logf("slowest reconnect after the service came back: %v", worst)
	require.LessOrEqual(t, worst, 2*time.Second, "every runner reconnects within 2 s of the service")

	for i, c := range clients {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(t, c.Close(ctx))
		cancel()
		require.NoError(t, c.Err())
		evs := svc.events(fmt.Sprintf("task-%d", i))
		requireGapFree(t, evs)
		require.Equal(t, want[i], lines(evs), "every event once, in order")
	}
}

// TestRetriesEveryTransientCode: whatever a database outage or a restart makes the server
// answer, at Hello or in the middle of a stream, the runner keeps going and loses nothing.
// Internal is what PostgreSQL stopping for 10 s produced; it used to be fatal.
func TestRetriesEveryTransientCode(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.Internal, codes.Unknown, codes.ResourceExhausted,
		codes.DeadlineExceeded, codes.Aborted, codes.Canceled} {
		t.Run(code.String(), func(t *testing.T) {
			svc := newEventsServer()
			svc.failHello = func(_ string, attempt int) error {
				if attempt < 4 || attempt == 5 {
					return status.Error(code, "database is down")
				}
				return nil
			}
			svc.failAfter = func(_ string, attempt int) (int, error) {
				if attempt == 4 {
					return 7, status.Error(code, "database went down")
				}
				return -1, nil
			}
			ts := startTCP(t, svc)
			c := ts.client(t, "task-1", eventsclient.Config{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
			var want []string
			for k := range 20 {
				want = append(want, fmt.Sprint("line ", k))
				_, err := c.Send(logLine(want[k]))
				require.NoError(t, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, c.Close(ctx))
			require.NoError(t, c.Err())
			evs := svc.events("task-1")
			requireGapFree(t, evs)
			require.Equal(t, want, lines(evs))
			require.GreaterOrEqual(t, len(svc.helloTimes("task-1")), 7, "it took every retry")
		})
	}
}

// TestSpillsToDiskAndLosesNothing: with the service down, a runner with a small memory
// buffer accepts every event (it used to refuse log events with ErrBufferFull), keeps only
// BufferSize of them in memory and the rest in a file in its work directory, delivers all of
// them in order once the service answers, and removes the file.
func TestSpillsToDiskAndLosesNothing(t *testing.T) {
	svc := newEventsServer()
	var mu sync.Mutex
	down := true
	svc.failHello = func(string, int) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return status.Error(codes.Unavailable, "restarting")
		}
		return nil
	}
	ts := startTCP(t, svc)
	dir := t.TempDir()
	c := ts.client(t, "task-1", eventsclient.Config{SpillDir: dir, BufferSize: 8, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	var want []string
	for k := range 500 {
		if k%100 == 50 {
			_, err := c.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_APPLY}}})
			require.NoError(t, err)
			continue
		}
		want = append(want, fmt.Sprint("line ", k))
		seq, err := c.Send(logLine(want[len(want)-1]))
		require.NoError(t, err, "nothing is refused")
		require.Equal(t, int64(k+1), seq)
	}
	require.Equal(t, 500, c.Pending())
	require.Equal(t, 492, c.Spilled(), "only BufferSize events stay in memory")
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, files, 1, "one spill file in the work directory")
	info, err := files[0].Info()
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	mu.Lock()
	down = false
	mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Close(ctx))
	evs := svc.events("task-1")
	require.Len(t, evs, 500)
	requireGapFree(t, evs)
	require.Equal(t, want, lines(evs))
	files, err = os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, files, "the spill file is removed")
}

// TestHeartbeatCadenceSurvivesReconnects: the server drops every stream 60 ms after its
// Welcome, shorter than the 100 ms heartbeat interval. A heartbeat timer restarted by every
// reconnect never fires (the task then dies as runner_lost); one kept across reconnects keeps
// beating, a beat that fell in a gap going out right after the next Welcome.
func TestHeartbeatCadenceSurvivesReconnects(t *testing.T) {
	const interval = 100 * time.Millisecond
	svc := newEventsServer()
	svc.dropAfter = 60 * time.Millisecond
	ts := startTCP(t, svc)
	ts.client(t, "task-1", eventsclient.Config{HeartbeatInterval: interval, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	require.Eventually(t, func() bool { return len(svc.beatTimes("task-1")) >= 10 }, 10*time.Second, 10*time.Millisecond,
		"heartbeats keep coming although no stream outlives the interval")
	beats := svc.beatTimes("task-1")
	require.Greater(t, len(svc.helloTimes("task-1")), len(beats)/2, "the streams were really cut")
	for i := 1; i < len(beats); i++ {
		require.Less(t, beats[i].Sub(beats[i-1]), 4*interval, "heartbeat %d came late: the cadence was lost", i)
	}
}

// TestOversizedEventsNeverEndTheStream replays the agent turn that produced a 108,747-byte log
// event (refused by the server with InvalidArgument, which used to end the runner's stream with
// 30 events unsent), plus a single 100 KB line and an absurd failure reason. Every event the
// server gets is under its limit, nothing after them is lost, and the lines arrive in order
// (the one longer than a whole event cut with a visible mark).
func TestOversizedEventsNeverEndTheStream(t *testing.T) {
	svc := newEventsServer()
	ts := startTCP(t, svc)
	c := ts.client(t, "task-1", eventsclient.Config{})
	var burst []string
	total := 0
	for k := 0; total < 108_747; k++ {
		l := fmt.Sprintf(`{"line":%d,"text":"%s"}`, k, strings.Repeat(`quoted \"x\" `, 40))
		if total+len(l) > 108_747 {
			l = l[:108_747-total]
		}
		burst = append(burst, l)
		total += len(l)
	}
	require.Equal(t, 108_747, total)
	seq, err := c.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: burst, Stage: taskrunnerv1.TaskStage_TASK_STAGE_APPLY}}})
	require.NoError(t, err)
	require.Greater(t, seq, int64(2), "split into several events")

	huge := strings.Repeat("é", 50_000)
	_, err = c.Send(logLine(huge))
	require.NoError(t, err)
	_, err = c.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: strings.Repeat("why ", 50_000)}}})
	require.NoError(t, err)
	var after []string
	for k := range 30 {
		after = append(after, fmt.Sprint("after ", k))
		_, err := c.Send(logLine(after[k]))
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Close(ctx))
	require.NoError(t, c.Err())

	evs := svc.events("task-1")
	requireGapFree(t, evs)
	svc.mu.Lock()
	require.Zero(t, svc.sizeErrs, "no event over the limit reached the server")
	svc.mu.Unlock()
	for _, e := range evs {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(e)
		require.NoError(t, err)
		require.LessOrEqual(t, len(b), eventsclient.MaxEventBytes)
		if e.GetLog() != nil && e.GetSeq() <= seq {
			require.Equal(t, taskrunnerv1.TaskStage_TASK_STAGE_APPLY, e.GetLog().GetStage())
		}
	}
	got := lines(evs)
	require.Equal(t, burst, got[:len(burst)], "the burst arrives whole, in order")
	cut := got[len(burst)]
	require.Regexp(t, `^(é)+… \[truncated \d+ bytes\]$`, cut)
	require.Greater(t, len(cut), 40_000)
	require.Equal(t, after, got[len(burst)+1:])
	var reason string
	for _, e := range evs {
		if f := e.GetFailed(); f != nil {
			reason = f.GetReason()
		}
	}
	require.Contains(t, reason, "[truncated ")
	require.Less(t, len(reason), 5000)
}

// TestCloseWhileTheServiceIsDown: with everything acknowledged, Close returns at once even
// though the stream is waiting (WaitForReady) for an unreachable service.
func TestCloseWhileTheServiceIsDown(t *testing.T) {
	svc := newEventsServer()
	ts := startTCP(t, svc)
	retrying := make(chan struct{}, 1)
	log := slog.New(&signalHandler{msg: "events stream interrupted; reconnecting", ch: retrying})
	c := ts.client(t, "task-1", eventsclient.Config{Logger: log, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	_, err := c.Send(logLine("one"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.Acked() == 1 }, 10*time.Second, 5*time.Millisecond)
	ts.kill()
	select {
	case <-retrying:
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not notice the outage")
	}
	<-time.After(200 * time.Millisecond) // past the backoff: the next stream is waiting for the service
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, c.Close(ctx))
	require.Less(t, time.Since(start), 3*time.Second)
}

// signalHandler is a slog.Handler that signals ch when a record with message msg is logged.
type signalHandler struct {
	msg string
	ch  chan struct{}
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *signalHandler) WithGroup(string) slog.Handler      { return h }
