package sse_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/taskrunner/taskrunner/gateway/sse"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/task"
)

// TestConnectStormSharesLookups: many connections of one token to one task
// cost one owner check and one replay, not one each, and every one of them
// still gets the whole timeline.
func TestConnectStormSharesLookups(t *testing.T) {
	e := newEnv(t, sse.Config{AuthTTL: 5 * time.Second}, envOptions{})
	id := e.runningTask(t, "alice")
	tok := e.token(t, "alice")
	e.emit(t, id, logs(1, 3)...)
	tl := e.timeline(t, id)
	getTask := taskrunnerv1.TaskService_GetTask_FullMethodName
	listEvents := taskrunnerv1.EventsService_ListEvents_FullMethodName
	g0, l0 := e.calls.get(getTask), e.calls.get(listEvents)

	const n = 40
	clients := make([]*client, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// e.open uses require, which must run on the test's goroutine:
			// connect here, check below.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			t.Cleanup(cancel)
			resp, err := e.srv.Client().Do(e.request(t, ctx, eventsPath(id), tok, nil))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			t.Cleanup(func() { _ = resp.Body.Close() })
			clients[i] = newClient(resp)
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	for _, c := range clients {
		require.Equal(t, http.StatusOK, c.resp.StatusCode)
		first, err := c.next()
		require.NoError(t, err)
		require.NotEmpty(t, first.retry)
		checkMessages(t, c.take(t, len(tl)), tl)
	}
	gets, lists := e.calls.get(getTask)-g0, e.calls.get(listEvents)-l0
	t.Logf("%d connects: %d GetTask, %d ListEvents", n, gets, lists)
	require.LessOrEqual(t, gets, 2, "one owner check per token and task within the TTL")
	require.Less(t, lists, n, "replays are shared")

	// Live events reach every one of them, once.
	e.advance(t, id, task.Advance{Status: task.StatusCancelled, FailedReason: "storm over", Actor: task.UserActor("alice")})
	tl = e.timeline(t, id)
	for _, c := range clients {
		checkMessages(t, c.events(t), tl[len(tl)-1:])
	}
	require.Eventually(t, func() bool { return e.h.Subscribers() == 0 }, 10*time.Second, time.Millisecond)
	require.Zero(t, e.h.QueuedBytes())
}

// TestRevokedTokenIsRefusedWithinTheTTL: a kept owner check does not
// outlive the TTL, for new connections and for open streams.
func TestRevokedTokenIsRefusedWithinTheTTL(t *testing.T) {
	const ttl = 200 * time.Millisecond
	e := newEnv(t, sse.Config{AuthTTL: ttl, StatusInterval: 50 * time.Millisecond}, envOptions{})
	id := e.runningTask(t, "alice")
	tok, tokID, err := e.tokens.Create(context.Background(), "alice", []string{auth.ScopeTasks}, "test")
	require.NoError(t, err)
	open := e.open(t, eventsPath(id), tok, nil)
	checkMessages(t, open.take(t, len(e.timeline(t, id))), e.timeline(t, id))

	require.NoError(t, e.tokens.Revoke(context.Background(), tokID))
	revoked := time.Now()
	require.Eventually(t, func() bool {
		return e.status(t, eventsPath(id), tok, nil) == http.StatusUnauthorized
	}, 10*time.Second, 10*time.Millisecond)
	took := time.Since(revoked)
	t.Logf("refused %s after the revocation", took)
	require.Less(t, took, ttl+2*time.Second)
	// The open stream ends at its next status check after the TTL (its
	// reconnect then gets 401, and EventSource stops).
	require.Empty(t, open.events(t))
	require.Less(t, time.Since(revoked), ttl+5*time.Second)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, e.taskStatus(t, id), "the task itself goes on")
}

// TestCaughtUpStreamsPark: streams that have caught up hand their
// connections to their task's writer (no goroutine each), still get every
// live event once and in order in both views, park again after a burst,
// and a client that leaves a parked stream is noticed at once, without
// waiting for a heartbeat to fail.
func TestCaughtUpStreamsPark(t *testing.T) {
	e := newEnv(t, sse.Config{Heartbeat: time.Hour}, envOptions{})
	id := e.runningTask(t, "alice")
	tok := e.token(t, "alice")
	n0 := len(e.timeline(t, id))
	const full, seed = 20, 5
	var fulls, seeds []*client
	for range full {
		fulls = append(fulls, e.open(t, eventsPath(id), tok, after(n0)))
	}
	for range seed {
		seeds = append(seeds, e.open(t, seedPath(id), tok, after(n0)))
	}
	require.Eventually(t, func() bool { return e.h.Parked() == full+seed }, 10*time.Second, time.Millisecond)

	// Bursts of various sizes: each pass of the writer sends whatever
	// arrived since the last in one write per stream.
	next := int64(1)
	for _, burst := range []int{1, 7, 64, 3} {
		e.emit(t, id, logs(next, burst)...)
		tl := e.timeline(t, id)
		want := tl[len(tl)-burst:]
		for _, c := range fulls {
			checkMessages(t, c.take(t, burst), want)
		}
		for _, c := range seeds {
			got := c.take(t, burst)
			for i, m := range got {
				require.Equal(t, "log", m.event)
				require.Equal(t, want[i].GetSeq(), m.id)
			}
		}
		next += int64(burst)
		require.Eventually(t, func() bool { return e.h.Parked() == full+seed }, 10*time.Second, time.Millisecond, "parked again")
	}

	// A client goes: its parked stream ends within a moment (the heartbeat
	// is an hour away).
	require.NoError(t, fulls[0].resp.Body.Close())
	require.Eventually(t, func() bool { return e.h.Subscribers() == full+seed-1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, int64(full+seed-1), e.h.Parked())

	// The final event ends every parked stream cleanly.
	e.advance(t, id, task.Advance{Status: task.StatusCancelled, FailedReason: "enough", Actor: task.UserActor("alice")})
	tl := e.timeline(t, id)
	for _, c := range fulls[1:] {
		checkMessages(t, c.events(t), tl[len(tl)-1:])
	}
	for _, c := range seeds {
		got := c.events(t)
		require.NotEmpty(t, got)
		require.Equal(t, tl[len(tl)-1].GetSeq(), got[len(got)-1].id)
	}
	require.Eventually(t, func() bool { return e.h.Subscribers() == 0 }, 5*time.Second, time.Millisecond)
	require.Zero(t, e.h.Parked())
	require.Zero(t, e.h.QueuedBytes())
}

// TestParkedStreamsGetHeartbeats: a parked stream with nothing to say still
// gets a ping every heartbeat.
func TestParkedStreamsGetHeartbeats(t *testing.T) {
	e := newEnv(t, sse.Config{Heartbeat: 20 * time.Millisecond}, envOptions{})
	id := e.runningTask(t, "alice")
	c := e.open(t, eventsPath(id), e.token(t, "alice"), nil)
	c.take(t, len(e.timeline(t, id)))
	require.Eventually(t, func() bool { return e.h.Parked() == 1 }, 10*time.Second, time.Millisecond)
	start := time.Now()
	for range 5 {
		m, err := c.next()
		require.NoError(t, err)
		require.Equal(t, "ping", strings.TrimSpace(m.comment))
	}
	require.Less(t, time.Since(start), 2*time.Second)
	require.Equal(t, int64(1), e.h.Parked())
}

// TestHTTP2StreamsKeepTheirGoroutine: a stream whose connection cannot be
// taken over (HTTP/2) is served as before, by its own goroutine.
func TestHTTP2StreamsKeepTheirGoroutine(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{http2: true})
	id := e.runningTask(t, "alice")
	tok := e.token(t, "alice")
	n0 := len(e.timeline(t, id))
	var cs []*client
	for range 3 {
		c := e.open(t, eventsPath(id), tok, after(n0))
		require.Equal(t, 2, c.resp.ProtoMajor)
		cs = append(cs, c)
	}
	e.emit(t, id, logs(1, 20)...)
	tl := e.timeline(t, id)
	for _, c := range cs {
		checkMessages(t, c.take(t, 20), tl[n0:])
	}
	require.Zero(t, e.h.Parked())
	e.advance(t, id, task.Advance{Status: task.StatusCancelled, FailedReason: "enough", Actor: task.UserActor("alice")})
	tl = e.timeline(t, id)
	for _, c := range cs {
		checkMessages(t, c.events(t), tl[len(tl)-1:])
	}
	require.Eventually(t, func() bool { return e.h.Subscribers() == 0 }, 5*time.Second, time.Millisecond)
}

// TestRoundDurationIsReported: the rounds of a task's writer over its
// parked streams reach /metrics as taskrunner.sse.round_duration, one
// observation per round that wrote, each as long as the round took.
func TestRoundDurationIsReported(t *testing.T) {
	e := newEnv(t, sse.Config{Heartbeat: time.Hour}, envOptions{})
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	require.NoError(t, e.h.RegisterMetrics(mp.Meter("test")))

	id := e.runningTask(t, "alice")
	tok := e.token(t, "alice")
	n0 := len(e.timeline(t, id))
	const subs = 10
	var cs []*client
	for range subs {
		cs = append(cs, e.open(t, eventsPath(id), tok, after(n0)))
	}
	require.Eventually(t, func() bool { return e.h.Parked() == subs }, 10*time.Second, time.Millisecond)
	rounds := func() metricdata.HistogramDataPoint[float64] {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == "taskrunner.sse.round_duration" {
					h := m.Data.(metricdata.Histogram[float64])
					require.Len(t, h.DataPoints, 1)
					return h.DataPoints[0]
				}
			}
		}
		return metricdata.HistogramDataPoint[float64]{}
	}
	require.Zero(t, rounds().Count, "nothing written yet")

	start := time.Now()
	next := int64(1)
	for burst := range 5 {
		e.emit(t, id, logs(next, burst+1)...)
		for _, c := range cs {
			c.take(t, burst+1)
		}
		next += int64(burst + 1)
		require.Eventually(t, func() bool { return e.h.Parked() == subs }, 10*time.Second, time.Millisecond)
	}
	// A round is recorded when the writer comes back after its writes, so
	// the last one may land just after its client has read.
	p := rounds()
	for deadline := time.Now().Add(5 * time.Second); p.Count < 5 && time.Now().Before(deadline); p = rounds() {
		time.Sleep(time.Millisecond)
	}
	took := time.Since(start)
	require.GreaterOrEqual(t, p.Count, uint64(5), "a round per burst at least")
	require.Greater(t, p.Sum, 0.0)
	mx, ok := p.Max.Value()
	require.True(t, ok)
	require.Less(t, mx, took.Seconds(), "no round outlasts the bursts")
}
