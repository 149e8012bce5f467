package sse_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/gateway/rest"
	"github.com/taskrunner/taskrunner/gateway/sse"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/events"
	"github.com/taskrunner/taskrunner/services/task"
)

func eventsPath(id string) string { return "/v1/tasks/" + id + "/events" }

// checkMessages asserts ids from..to in order, each with the event name of
// its payload and data that decodes to that very event.
func checkMessages(t *testing.T, got []msg, want []*taskrunnerv1.Event) {
	t.Helper()
	require.Len(t, got, len(want))
	for i, m := range got {
		require.Equal(t, want[i].GetSeq(), m.id, "message %d", i)
		require.Equal(t, events.TypeName(want[i]), m.event, "message %d", i)
		ev, err := events.DecodeEvent([]byte(m.data))
		require.NoError(t, err)
		require.Equal(t, want[i].GetSeq(), ev.GetSeq())
		require.Equal(t, events.TypeName(want[i]), events.TypeName(ev))
	}
}

func TestTwoClientsSeeEveryEventOnceInOrder(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.runningTask(t, "alice")
	tok := e.token(t, "alice")
	a := e.open(t, eventsPath(id), tok, nil)
	b := e.open(t, eventsPath(id), tok, nil)
	require.Equal(t, int64(2), e.h.Subscribers())
	require.Equal(t, 1, e.h.Channels(), "one Redis subscription serves both clients")

	evs := []*taskrunnerv1.Event{
		at(1, stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE)),
		at(2, logLine("reading the code")),
		at(3, stage(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE)),
		at(4, logLine("writing a proposal")),
		at(5, stage(taskrunnerv1.TaskStage_TASK_STAGE_APPLY)),
		at(6, diff(12, 3, 2)),
		at(7, logLine("tests pass")),
		at(8, stage(taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE)),
		at(9, diff(14, 3, 3)),
		at(10, completed("https://github.com/acme/widgets/pull/7", 7)),
	}
	// The real path: a runner over mTLS, group commit, publish after commit.
	r := e.runner(t, id)
	r.send(t, evs[:4]...)
	r.send(t, evs[4:]...)

	var wg sync.WaitGroup
	got := make([][]msg, 2)
	for i, c := range []*client{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = c.events(t) // returns at EOF: the stream closed after completed
		}()
	}
	wg.Wait()
	for i := range got {
		checkMessages(t, got[i], evs)
	}
	require.Contains(t, got[0][9].data, "https://github.com/acme/widgets/pull/7")
	require.Eventually(t, func() bool { return e.h.Subscribers() == 0 && e.h.Channels() == 0 }, 10*time.Second, time.Millisecond,
		"the channel is unsubscribed after its last watcher")

	// The task is finished: a new client gets the whole history and the end.
	checkMessages(t, e.open(t, eventsPath(id), tok, nil).events(t), evs)
}

func TestReconnectGetsExactlyTheMissingEvents(t *testing.T) {
	cases := []struct {
		name  string
		query string
		hdr   map[string]string
	}{
		{name: "Last-Event-ID header", hdr: map[string]string{"Last-Event-ID": "6"}},
		{name: "last_event_id parameter", query: "?last_event_id=6"},
		{name: "access_token and last_event_id parameters", query: "?last_event_id=6&access_token="},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Pages of 4 so the replay takes several ListEvents calls.
			e := newEnv(t, sse.Config{ReplayPageSize: 4}, envOptions{})
			id := e.newTask(t, "alice")
			tok := e.token(t, "alice")
			e.emit(t, id, logs(1, 10)...)
			// Events 11..15 are committed and published after the stream
			// subscribed and before it replays: the replay and the live
			// feed both carry them.
			sse.SetBeforeReplay(e.h, func(string) { e.emit(t, id, logs(11, 5)...) })
			path, token := eventsPath(id)+tc.query, tok
			if strings.Contains(tc.query, "access_token=") {
				path, token = path+url.QueryEscape(tok), ""
			}
			c := e.open(t, path, token, tc.hdr)
			checkMessages(t, c.take(t, 9), logs(7, 9))
			sse.SetBeforeReplay(e.h, nil)
			tail := []*taskrunnerv1.Event{at(16, logLine("after replay")), at(17, completed("https://github.com/acme/widgets/pull/8", 8))}
			e.emit(t, id, tail...)
			checkMessages(t, c.events(t), tail)
		})
	}
}

func TestGapIsFilledFromTheLog(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.newTask(t, "alice")
	c := e.open(t, eventsPath(id), e.token(t, "alice"), nil)
	e.emit(t, id, logs(1, 3)...)
	checkMessages(t, c.take(t, 3), logs(1, 3))
	// 4 and 5 are committed but their messages are lost; 6 arrives live.
	e.store(t, id, logs(4, 2)...)
	e.emit(t, id, logs(6, 1)...)
	checkMessages(t, c.take(t, 3), logs(4, 3))
	// A duplicate and an old message change nothing.
	e.publish(t, id, logs(5, 2)...)
	end := at(7, failed("tests failed"))
	e.emit(t, id, end)
	checkMessages(t, c.events(t), []*taskrunnerv1.Event{end})
}

func TestStreamEndsAfterTheTerminalEvent(t *testing.T) {
	cases := []struct {
		name string
		end  *taskrunnerv1.Event
	}{
		{name: "completed", end: completed("https://github.com/acme/widgets/pull/9", 9)},
		{name: "failed", end: failed("agent crashed")},
		{name: "cancelled", end: cancelled("cancelled by the owner")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, sse.Config{}, envOptions{})
			id := e.runningTask(t, "alice")
			tok := e.token(t, "alice")
			want := []*taskrunnerv1.Event{at(1, stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE)), at(2, logLine("working")), at(3, tc.end)}

			// Through the runner protocol, so the task's status follows the
			// terminal event as in production.
			live := e.open(t, eventsPath(id), tok, nil)
			e.runner(t, id).send(t, want...)
			checkMessages(t, live.events(t), want)

			// Replayed: the stream ends right after the replay, and a
			// reconnect after the terminal event gets nothing but the end.
			checkMessages(t, e.open(t, eventsPath(id), tok, nil).events(t), want)
			require.Empty(t, e.open(t, eventsPath(id), tok, map[string]string{"Last-Event-ID": "3"}).events(t))
		})
	}
}

func TestStreamEndsForTaskFinishedWithoutTerminalEvent(t *testing.T) {
	e := newEnv(t, sse.Config{StatusInterval: 20 * time.Millisecond}, envOptions{})
	tok := e.token(t, "alice")
	reap := func(id string) {
		_, applied, err := e.tasks.Advance(context.Background(), id, "", task.Advance{Status: task.StatusFailed, FailedReason: "runner_lost", RequestID: "reaper"})
		require.NoError(t, err)
		require.True(t, applied)
	}

	// Already finished when the client connects: replay, then the end.
	id := e.runningTask(t, "alice")
	e.emit(t, id, logs(1, 2)...)
	reap(id)
	require.Equal(t, []int64{1, 2}, ids(e.open(t, eventsPath(id), tok, nil).events(t)))

	// Finished while the client watches: the status check ends the stream
	// after writing what the log holds.
	id = e.runningTask(t, "alice")
	c := e.open(t, eventsPath(id), tok, nil)
	e.emit(t, id, logs(1, 1)...)
	require.Equal(t, []int64{1}, ids(c.take(t, 1)))
	e.store(t, id, logs(2, 1)...) // committed, message lost
	reap(id)
	require.Equal(t, []int64{2}, ids(c.events(t)))
}

func TestSlowClientIsCutOffWithoutDelayingOthers(t *testing.T) {
	// A generous write timeout: the slow client must be cut because its
	// queue filled, not because a write timed out.
	e := newEnv(t, sse.Config{ClientQueue: 64, WriteTimeout: time.Minute}, envOptions{smallSendBuffer: true})
	id := e.newTask(t, "alice")
	tok := e.token(t, "alice")

	// The slow client reads the response head and the retry hint, then
	// nothing: its receive buffer is tiny, so the server's writes block soon.
	d := net.Dialer{}
	conn, err := d.Dial("tcp", e.srv.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer %s\r\n\r\n", eventsPath(id), tok)
	require.NoError(t, err)
	slow := bufio.NewReader(conn)
	for {
		line, err := slow.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "retry:") {
			break
		}
	}
	fast := e.open(t, eventsPath(id), tok, nil)
	require.Equal(t, int64(2), e.h.Subscribers())

	// 25 bursts of 16 events of 2 KB, each published once the fast client
	// has the previous one: a client that keeps up never has more than a
	// burst queued, the slow one's kernel buffers fill within the first
	// bursts and its queue of 64 a few bursts later.
	const n, burst = 400, 16
	big := strings.Repeat("x", 2000)
	evs := make([]*taskrunnerv1.Event, n)
	for i := range evs {
		evs[i] = at(int64(i+1), logLine(fmt.Sprintf("%d %s", i+1, big)))
	}
	var got []msg
	var slowest time.Duration
	for from := 0; from < n; from += burst {
		start := time.Now()
		e.emit(t, id, evs[from:from+burst]...)
		got = append(got, fast.take(t, burst)...)
		slowest = max(slowest, time.Since(start))
	}
	require.Equal(t, seqRange(1, n), ids(got))
	t.Logf("slowest burst of %d events reached the fast client in %s", burst, slowest)
	require.Less(t, slowest, 5*time.Second, "the fast client's deliveries stayed on time")
	// The slow one was dropped; the fast one is still open.
	require.Eventually(t, func() bool { return e.h.Subscribers() == 1 }, 10*time.Second, time.Millisecond)

	end := at(n+1, completed("https://github.com/acme/widgets/pull/10", 10))
	e.emit(t, id, end)
	checkMessages(t, fast.events(t), []*taskrunnerv1.Event{end})

	// What the slow client finally reads is a prefix without the end.
	rest, _ := io.ReadAll(slow) // ends with EOF or a reset
	require.NotContains(t, string(rest), "event: completed")
	require.Less(t, strings.Count(string(rest), "event: log"), n)
}

func TestHeartbeat(t *testing.T) {
	e := newEnv(t, sse.Config{Heartbeat: 10 * time.Millisecond}, envOptions{})
	id := e.newTask(t, "alice")
	c := e.open(t, eventsPath(id), e.token(t, "alice"), nil)
	for range 3 {
		m, err := c.next()
		require.NoError(t, err)
		require.Equal(t, msg{comment: "ping"}, m)
	}
}

func TestLegacyPath(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.newTask(t, "alice")
	tok := e.token(t, "alice")
	want := []*taskrunnerv1.Event{at(1, logLine("hello")), at(2, completed("https://github.com/acme/widgets/pull/3", 3))}
	e.emit(t, id, want...)
	for _, path := range []string{
		"/v1/projects/acme%2Fwidgets/branches/main/tasks/" + id + "/events",
		"/v1/projects/acme/widgets/branches/main/tasks/" + id + "/events",
		"/v1/projects/Acme%2FWidgets/branches/taskrunner%2F" + id + "/tasks/" + id + "/events", // head branch
	} {
		t.Run(path, func(t *testing.T) {
			checkMessages(t, e.open(t, path, tok, nil).events(t), want)
		})
	}
}

// apiError is the REST API's error body.
type apiError struct {
	Code    int               `json:"code"`
	Message string            `json:"message"`
	Details []json.RawMessage `json:"details"`
}

func TestErrors(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.newTask(t, "alice")
	alice, bob := e.token(t, "alice"), e.token(t, "bob")
	cases := []struct {
		name     string
		path     string
		hdr      map[string]string
		wantHTTP int
		wantCode int // gRPC code in the body
	}{
		{name: "another owner", path: eventsPath(id), hdr: map[string]string{"Authorization": "Bearer " + bob}, wantHTTP: 404, wantCode: 5},
		{name: "another owner by parameter", path: eventsPath(id) + "?access_token=" + url.QueryEscape(bob), wantHTTP: 404, wantCode: 5},
		{name: "missing task", path: eventsPath("6f1c1c9e-9d7e-4a39-9d0e-3b8f0b1c2d3e"), hdr: map[string]string{"Authorization": "Bearer " + alice}, wantHTTP: 404, wantCode: 5},
		{name: "no token", path: eventsPath(id), wantHTTP: 401, wantCode: 16},
		{name: "unknown token", path: eventsPath(id), hdr: map[string]string{"Authorization": "Bearer nope"}, wantHTTP: 401, wantCode: 16},
		{name: "not a bearer header", path: eventsPath(id), hdr: map[string]string{"Authorization": "Basic YTpi"}, wantHTTP: 401, wantCode: 16},
		{name: "not a task id", path: eventsPath("nope"), hdr: map[string]string{"Authorization": "Bearer " + alice}, wantHTTP: 400, wantCode: 3},
		{name: "bad Last-Event-ID", path: eventsPath(id), hdr: map[string]string{"Authorization": "Bearer " + alice, "Last-Event-ID": "abc"}, wantHTTP: 400, wantCode: 3},
		{name: "legacy: other repository", path: "/v1/projects/acme%2Fgadgets/branches/main/tasks/" + id + "/events", hdr: map[string]string{"Authorization": "Bearer " + alice}, wantHTTP: 404, wantCode: 5},
		{name: "legacy: other branch", path: "/v1/projects/acme/widgets/branches/dev/tasks/" + id + "/events", hdr: map[string]string{"Authorization": "Bearer " + alice}, wantHTTP: 404, wantCode: 5},
		{name: "legacy: another owner", path: "/v1/projects/acme/widgets/branches/main/tasks/" + id + "/events", hdr: map[string]string{"Authorization": "Bearer " + bob}, wantHTTP: 404, wantCode: 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := e.srv.Client().Do(e.request(t, ctx, tc.path, "", tc.hdr))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tc.wantHTTP, resp.StatusCode)
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var body apiError
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			require.Equal(t, tc.wantCode, body.Code)
			require.NotEmpty(t, body.Message)
			if tc.wantHTTP == http.StatusUnauthorized {
				require.Equal(t, `Bearer realm="taskrunner"`, resp.Header.Get("WWW-Authenticate"))
			}
		})
	}
	require.Equal(t, int64(0), e.h.Subscribers())
	require.Equal(t, 0, e.h.Channels(), "a refused caller never subscribes")
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  sse.Config
		ok   bool
	}{
		{name: "defaults", cfg: sse.Config{}, ok: true},
		{name: "negative heartbeat", cfg: sse.Config{Heartbeat: -time.Second}},
		{name: "negative queue", cfg: sse.Config{ClientQueue: -1}},
		{name: "page too large", cfg: sse.Config{ReplayPageSize: 1001}},
		{name: "negative write timeout", cfg: sse.Config{WriteTimeout: -1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}

func TestCloseEndsStreams(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.newTask(t, "alice")
	c := e.open(t, eventsPath(id), e.token(t, "alice"), nil)
	e.emit(t, id, logs(1, 2)...)
	require.Equal(t, []int64{1, 2}, ids(c.take(t, 2)))
	e.h.Close()
	require.Empty(t, c.events(t), "the stream ends cleanly; the client resumes elsewhere with Last-Event-ID 2")
	require.Equal(t, int64(0), e.h.Subscribers())
	require.Equal(t, 0, e.h.Channels())
}

// TestMountedInRESTHandler serves the routes the way the gateway does,
// through rest.Options.Extra next to grpc-gateway's /v1/ routes.
func TestMountedInRESTHandler(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	api, err := rest.Handler(ctx, rest.Options{Task: e.cc, Events: e.cc, MaxBodyBytes: 64 << 10,
		Logger: slog.New(slog.DiscardHandler), Extra: e.h.Routes()})
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	defer srv.Close()
	e.srv.URL = srv.URL // e.open and e.request now go through the REST handler

	id := e.newTask(t, "alice")
	tok := e.token(t, "alice")
	want := []*taskrunnerv1.Event{at(1, logLine("hello")), at(2, completed("https://github.com/acme/widgets/pull/4", 4))}
	e.emit(t, id, want...)
	for _, path := range []string{eventsPath(id), "/v1/projects/acme%2Fwidgets/branches/main/tasks/" + id + "/events"} {
		c := e.open(t, path, tok, nil)
		require.NotEmpty(t, c.resp.Header.Get(rest.RequestIDHeader), "inside the request-id middleware")
		checkMessages(t, c.events(t), want)
	}
	// grpc-gateway still owns its neighbour route.
	resp, err := srv.Client().Do(e.request(t, ctx, "/v1/tasks/"+id+"/events:list", tok, nil))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var list struct {
		Events []json.RawMessage `json:"events"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	require.Len(t, list.Events, 2)
}
