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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/taskrunner/taskrunner/gateway/rest"
	"github.com/taskrunner/taskrunner/gateway/sse"
	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/task"
)

func eventsPath(id string) string { return "/v1/tasks/" + id + "/events" }

func seedPath(id string) string {
	return "/projects/acme%2Fwidgets/branches/main/tasks/" + id + "/events"
}

// checkMessages asserts that got is want, message by message: the id is
// the event's seq, the event name its type, the data exactly its JSON.
func checkMessages(t *testing.T, got []msg, want []*taskrunnerv1.Event) {
	t.Helper()
	require.Equal(t, seqsOf(want), ids(got))
	for i, m := range got {
		require.Equal(t, eventwire.TypeName(want[i]), m.event, "message %d", i)
		ev, err := eventwire.DecodeEvent([]byte(m.data))
		require.NoError(t, err)
		require.True(t, proto.Equal(want[i], ev), "message %d: got %v, want %v", i, ev, want[i])
	}
}

func seqsOf(evs []*taskrunnerv1.Event) []int64 {
	out := make([]int64, 0, len(evs))
	for _, ev := range evs {
		out = append(out, ev.GetSeq())
	}
	return out
}

// statusTo is the status a status_change event moves to (UNSPECIFIED for other events).
func statusTo(ev *taskrunnerv1.Event) taskrunnerv1.TaskStatus { return ev.GetStatusChange().GetTo() }

// after is a Last-Event-ID header.
func after(n int) map[string]string { return map[string]string{"Last-Event-ID": strconv.Itoa(n)} }

// stillOpen reads n heartbeats: the stream is open and idle.
func stillOpen(t *testing.T, c *client, n int) {
	t.Helper()
	for range n {
		m, err := c.next()
		require.NoError(t, err)
		require.Equal(t, msg{comment: "ping"}, m, "only heartbeats while nothing happens")
	}
}

func TestTwoClientsSeeEveryEventOnceInOrder(t *testing.T) {
	e := newEnv(t, sse.Config{Heartbeat: 20 * time.Millisecond}, envOptions{})
	id := e.runningTask(t, "alice")
	n0 := len(e.timeline(t, id)) // created, running
	tok := e.token(t, "alice")
	a := e.open(t, eventsPath(id), tok, nil)
	b := e.open(t, eventsPath(id), tok, nil)
	require.Equal(t, int64(2), e.h.Subscribers())
	require.Equal(t, 1, e.h.Channels(), "one Redis subscription serves both clients")

	// The real path: a runner over mTLS, group commit, publish after commit.
	evs := withSeqs(
		stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE), logLine("reading the code"),
		stage(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE), logLine("writing a proposal"),
		stage(taskrunnerv1.TaskStage_TASK_STAGE_APPLY), diff(12, 3, 2), logLine("tests pass"),
		stage(taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE), diff(14, 3, 3), completed("https://github.com/acme/widgets/pull/7", 7),
	)
	r := e.runner(t, id)
	r.send(t, evs[:4]...)
	r.send(t, evs[4:]...)

	// 10 runner events, awaiting_review, and the streams stay open
	// (completed is not the end).
	tl := e.timeline(t, id)
	require.Len(t, tl, n0+11)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW, statusTo(tl[n0+10]))
	for _, c := range []*client{a, b} {
		checkMessages(t, c.take(t, n0+11), tl)
		stillOpen(t, c, 2)
	}

	// The pull request is merged: done ends both streams.
	e.advance(t, id, task.Advance{Status: task.StatusDone, Actor: task.ActorGitHub, Reason: "pull request merged"})
	tl = e.timeline(t, id)
	require.Len(t, tl, n0+12)
	for _, c := range []*client{a, b} {
		checkMessages(t, c.events(t), tl[n0+11:])
	}
	require.Eventually(t, func() bool { return e.h.Subscribers() == 0 && e.h.Channels() == 0 }, 10*time.Second, time.Millisecond,
		"the channel is unsubscribed after its last watcher")

	// The task is finished: a new client gets the whole history and the end,
	// and its reconnect (EventSource reconnects after any close) gets 204.
	checkMessages(t, e.open(t, eventsPath(id), tok, nil).events(t), tl)
	require.Equal(t, http.StatusNoContent, e.status(t, eventsPath(id), tok, after(len(tl))))
	require.Equal(t, 0, e.h.Channels(), "a finished task is not subscribed")
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
			n0 := len(e.timeline(t, id))
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
			checkMessages(t, c.take(t, 9), e.timeline(t, id)[6:15])
			sse.SetBeforeReplay(e.h, nil)
			e.emit(t, id, logLine("after replay"))
			e.cancelTask(t, id, tok, "not needed")
			tl := e.timeline(t, id)
			require.Len(t, tl, n0+17)
			checkMessages(t, c.events(t), tl[15:])
		})
	}
}

func TestGapIsFilledFromTheLog(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.newTask(t, "alice")
	n0 := len(e.timeline(t, id))
	c := e.open(t, eventsPath(id), e.token(t, "alice"), nil)
	e.emit(t, id, logs(1, 3)...)
	checkMessages(t, c.take(t, n0+3), e.timeline(t, id))
	// Two are committed but their messages are lost; the next arrives live.
	e.appendTo(t, id, false, logs(4, 2)...)
	e.emit(t, id, logs(6, 1)...)
	checkMessages(t, c.take(t, 3), e.timeline(t, id)[n0+3:n0+6])
	// A duplicate and an old message change nothing.
	tl := e.timeline(t, id)
	e.publish(t, id, tl[n0+4], tl[n0+5], tl[n0+1])
	e.advance(t, id, task.Advance{Status: task.StatusFailed, FailedReason: "sandbox failed to start", Actor: task.ActorDispatch})
	tl = e.timeline(t, id)
	require.Len(t, tl, n0+7)
	checkMessages(t, c.events(t), tl[n0+6:])
}

// TestStreamEndsOnlyAfterTheFinalEvent: the runner's failed or cancelled is
// not the end; the status_change that follows it is.
func TestStreamEndsOnlyAfterTheFinalEvent(t *testing.T) {
	cases := []struct {
		name string
		end  *taskrunnerv1.Event
		want taskrunnerv1.TaskStatus
	}{
		{name: "failed", end: failed("agent crashed"), want: taskrunnerv1.TaskStatus_TASK_STATUS_FAILED},
		{name: "cancelled", end: cancelled("stopped on request"), want: taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, sse.Config{}, envOptions{})
			id := e.runningTask(t, "alice")
			n0 := len(e.timeline(t, id))
			tok := e.token(t, "alice")
			live := e.open(t, eventsPath(id), tok, nil)
			e.runner(t, id).send(t, withSeqs(stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE), logLine("working"), tc.end)...)
			tl := e.timeline(t, id)
			require.Len(t, tl, n0+4) // 3 runner events, the final status_change
			require.Equal(t, tc.want, statusTo(tl[n0+3]))
			require.True(t, eventwire.Final(tl[n0+3]))
			require.False(t, eventwire.Final(tl[n0+2]), "the runner's own end is not the end")
			checkMessages(t, live.events(t), tl)

			// Replayed: the stream ends right after the final event; a
			// reconnect before it gets the rest, one at it 204.
			checkMessages(t, e.open(t, eventsPath(id), tok, nil).events(t), tl)
			checkMessages(t, e.open(t, eventsPath(id), tok, after(n0+1)).events(t), tl[n0+1:])
			for _, last := range []int{len(tl), len(tl) + 1, 1000} {
				require.Equal(t, http.StatusNoContent, e.status(t, eventsPath(id), tok, after(last)))
				require.Equal(t, http.StatusNoContent, e.status(t, seedPath(id), tok, after(last)))
			}
		})
	}
}

func TestCancelledBeforeDispatch(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.newTask(t, "alice")
	n0 := len(e.timeline(t, id))
	tok := e.token(t, "alice")
	full := e.open(t, eventsPath(id), tok, nil)
	seed := e.open(t, seedPath(id), tok, after(n0))
	e.cancelTask(t, id, tok, "changed my mind")

	tl := e.timeline(t, id)
	require.Len(t, tl, n0+1)
	sc := tl[n0].GetStatusChange()
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, sc.GetFrom())
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED, sc.GetTo())
	require.Equal(t, "user:alice", sc.GetActor())
	checkMessages(t, full.events(t), tl) // and then a clean end (EOF)
	require.Equal(t, "event: stage_change\ndata: {\"stage\":\"\",\"status\":\"cancelled\"}\n\n"+
		fmt.Sprintf("id: %d\nevent: failed\ndata: {\"reason\":\"changed my mind\"}\n\n", n0+1), seed.rest(t))

	// EventSource reconnects with the last id it saw: 204, and it stops.
	for _, path := range []string{eventsPath(id), seedPath(id)} {
		require.Equal(t, http.StatusNoContent, e.status(t, path, tok, after(n0+1)))
		// A client that saw nothing gets the story and the end.
		got := e.open(t, path, tok, nil).events(t)
		require.Equal(t, int64(n0+1), got[len(got)-1].id)
	}
	require.Equal(t, int64(0), e.h.Subscribers())
	require.Equal(t, 0, e.h.Channels())
}

// TestReaperFailuresAreEvents: the reaper's verdicts (as Dispatch's reaper
// writes them) reach open streams as the final event.
func TestReaperFailuresAreEvents(t *testing.T) {
	for _, reason := range []string{"timeout", "runner_lost: nothing heard from the runner for 30s"} {
		t.Run(strings.Fields(reason)[0], func(t *testing.T) {
			e := newEnv(t, sse.Config{}, envOptions{})
			id := e.runningTask(t, "alice")
			n0 := len(e.timeline(t, id)) // the last is running's status_change
			tok := e.token(t, "alice")
			full := e.open(t, eventsPath(id), tok, nil)
			seed := e.open(t, seedPath(id), tok, after(n0-1))
			e.runner(t, id).send(t, withSeqs(stage(taskrunnerv1.TaskStage_TASK_STAGE_APPLY), logLine("still working"))...)
			checkMessages(t, full.take(t, n0+2), e.timeline(t, id))

			e.advance(t, id, task.Advance{Status: task.StatusFailed, FailedReason: reason, Actor: task.ActorReaper})
			tl := e.timeline(t, id)
			require.Len(t, tl, n0+3)
			sc := tl[n0+2].GetStatusChange()
			require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, sc.GetTo())
			require.Equal(t, "reaper", sc.GetActor())
			require.Equal(t, reason, sc.GetReason())
			checkMessages(t, full.events(t), tl[n0+2:])

			reasonJSON, err := json.Marshal(reason)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("id: %d\nevent: stage_change\ndata: {\"stage\":\"\",\"status\":\"running\"}\n\n", n0)+
				fmt.Sprintf("id: %d\nevent: stage_change\ndata: {\"stage\":\"apply\",\"status\":\"running\"}\n\n", n0+1)+
				fmt.Sprintf("id: %d\nevent: log\ndata: {\"tail\":\"still working\"}\n\n", n0+2)+
				"event: stage_change\ndata: {\"stage\":\"apply\",\"status\":\"failed\"}\n\n"+
				fmt.Sprintf("id: %d\nevent: failed\ndata: {\"reason\":%s}\n\n", n0+3, reasonJSON), seed.rest(t))
			require.Equal(t, http.StatusNoContent, e.status(t, eventsPath(id), tok, after(n0+3)))
		})
	}
}

func TestAwaitingReviewStaysOpenUntilMerged(t *testing.T) {
	e := newEnv(t, sse.Config{Heartbeat: 20 * time.Millisecond}, envOptions{})
	id := e.runningTask(t, "alice")
	n0 := len(e.timeline(t, id))
	tok := e.token(t, "alice")
	c := e.open(t, eventsPath(id), tok, nil)
	e.runner(t, id).send(t, withSeqs(stage(taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE), completed("https://github.com/acme/widgets/pull/11", 11))...)
	tl := e.timeline(t, id)
	require.Len(t, tl, n0+3)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW, statusTo(tl[n0+2]))
	checkMessages(t, c.take(t, n0+3), tl)
	stillOpen(t, c, 3)
	// A client connecting now replays and stays open too.
	late := e.open(t, eventsPath(id), tok, after(n0+1))
	checkMessages(t, late.take(t, 2), tl[n0+1:])
	stillOpen(t, late, 1)

	e.advance(t, id, task.Advance{Status: task.StatusDone, Actor: task.ActorGitHub, Reason: "pull request merged"})
	tl = e.timeline(t, id)
	require.Len(t, tl, n0+4)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_DONE, statusTo(tl[n0+3]))
	require.Equal(t, "github", tl[n0+3].GetStatusChange().GetActor())
	checkMessages(t, c.events(t), tl[n0+3:])
	checkMessages(t, late.events(t), tl[n0+3:])
	require.Equal(t, http.StatusNoContent, e.status(t, eventsPath(id), tok, after(n0+4)))
}

// TestResumeAcrossControlPlaneAndRunnerEvents: clients that come and go
// with Last-Event-ID while the control plane and the runner both write the
// timeline see it exactly once, in order.
func TestResumeAcrossControlPlaneAndRunnerEvents(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.newTask(t, "alice")
	n0 := len(e.timeline(t, id))
	tok := e.token(t, "alice")
	var got []msg
	last := func() map[string]string {
		return map[string]string{"Last-Event-ID": strconv.FormatInt(got[len(got)-1].id, 10)}
	}

	a := e.open(t, eventsPath(id), tok, nil)
	e.advance(t, id, task.Advance{Status: task.StatusQueued, Actor: task.ActorDispatch})
	e.emit(t, id, queuePos(1))
	e.dispatched(t, id)
	e.emit(t, id, sandboxState("started"))
	e.advance(t, id, task.Advance{Status: task.StatusRunning, Actor: task.ActorDispatch})
	got = append(got, a.take(t, n0+4)...)
	_ = a.resp.Body.Close()

	r := e.runner(t, id)
	r.send(t, withSeqs(stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE), logLine("one"))...)
	e.emit(t, id, sandboxState("healthy"))
	r.send(t, &taskrunnerv1.Event{Seq: 3, Payload: diff(1, 2, 3).GetPayload()})
	b := e.open(t, eventsPath(id), tok, last())
	got = append(got, b.take(t, 4)...)
	r.send(t, &taskrunnerv1.Event{Seq: 4, Payload: completed("https://github.com/acme/widgets/pull/12", 12).GetPayload()})
	got = append(got, b.take(t, 1)...) // completed; awaiting_review's status_change not read yet
	_ = b.resp.Body.Close()

	c := e.open(t, eventsPath(id), tok, last())
	e.advance(t, id, task.Advance{Status: task.StatusDone, Actor: task.ActorGitHub, Reason: "pull request merged"})
	got = append(got, c.events(t)...)

	tl := e.timeline(t, id)
	require.Len(t, tl, n0+11)
	checkMessages(t, got, tl)
	require.Equal(t, []string{
		"status_change", "queue_position", "sandbox", "status_change", // control plane
		"stage_change", "log", "sandbox", "diff_stats", "completed", // runner and control plane
		"status_change", "status_change", // awaiting_review, done
	}, typesOf(tl[n0:]))
}

func typesOf(evs []*taskrunnerv1.Event) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		out = append(out, eventwire.TypeName(ev))
	}
	return out
}

// legacyFinish ends a task the way the control plane did before
// status_change existed: the status moves, the timeline gets nothing.
func (e *env) legacyFinish(t *testing.T, id string, a task.Advance) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.quiet.InTx(ctx, func(tx *task.Tx) error {
		var before int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM task_events WHERE task_id = $1`, id).Scan(&before); err != nil {
			return err
		}
		if _, _, err := tx.Advance(ctx, id, "", a); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM task_events WHERE task_id = $1 AND seq > $2`, id, before)
		return err
	}))
}

// TestLegacyTimelineWithoutFinalEvent: the safety net for timelines written
// before status_change existed.
func TestLegacyTimelineWithoutFinalEvent(t *testing.T) {
	e := newEnv(t, sse.Config{StatusInterval: 20 * time.Millisecond}, envOptions{})
	tok := e.token(t, "alice")

	// Finished before the client connects: replay, then a clean end; the
	// seed view turns the runner's failed into failed at the end.
	id := e.newTask(t, "alice")
	n0 := len(e.timeline(t, id))
	e.appendTo(t, id, false, logLine("one"), logLine("two"), failed("tests failed"))
	e.legacyFinish(t, id, task.Advance{Status: task.StatusFailed, FailedReason: "tests failed", RequestID: "legacy"})
	tl := e.timeline(t, id)
	require.Len(t, tl, n0+3)
	require.False(t, eventwire.Final(tl[len(tl)-1]))
	checkMessages(t, e.open(t, eventsPath(id), tok, nil).events(t), tl)
	require.Equal(t, fmt.Sprintf("id: %d\nevent: log\ndata: {\"tail\":\"one\"}\n\n", n0+1)+
		fmt.Sprintf("id: %d\nevent: log\ndata: {\"tail\":\"two\"}\n\n", n0+2)+
		fmt.Sprintf("id: %d\nevent: failed\ndata: {\"reason\":\"tests failed\"}\n\n", n0+3), e.open(t, seedPath(id), tok, after(n0)).rest(t))
	require.Equal(t, http.StatusNoContent, e.status(t, eventsPath(id), tok, after(n0+3)))
	require.Equal(t, http.StatusNoContent, e.status(t, seedPath(id), tok, after(n0+3)))

	// A timeline whose last events the seed view does not send ends with an
	// id-only message, so the reconnect carries the last seq and gets 204.
	id = e.runningTask(t, "alice")
	n0 = len(e.timeline(t, id))
	e.appendTo(t, id, false, completed("https://github.com/acme/widgets/pull/5", 5), usage(0.5))
	e.legacyFinish(t, id, task.Advance{Status: task.StatusCancelled, FailedReason: "closed", RequestID: "legacy"})
	require.Equal(t, fmt.Sprintf("id: %d\nevent: stage_change\ndata: {\"stage\":\"\",\"status\":\"running\"}\n\n", n0)+
		fmt.Sprintf("id: %d\nevent: completed\ndata: {\"prUrl\":\"https://github.com/acme/widgets/pull/5\"}\n\n", n0+1)+
		fmt.Sprintf("id: %d\n\n", n0+2), e.open(t, seedPath(id), tok, after(n0-1)).rest(t))
	require.Equal(t, http.StatusNoContent, e.status(t, seedPath(id), tok, after(n0+2)))

	// Finished while the client watches: the status check ends the stream
	// after writing what the log holds.
	id = e.runningTask(t, "alice")
	n0 = len(e.timeline(t, id))
	c := e.open(t, eventsPath(id), tok, nil)
	e.emit(t, id, logLine("live"))
	checkMessages(t, c.take(t, n0+1), e.timeline(t, id))
	e.appendTo(t, id, false, logLine("message lost"))
	e.legacyFinish(t, id, task.Advance{Status: task.StatusFailed, FailedReason: "runner_lost", RequestID: "legacy"})
	tl = e.timeline(t, id)
	require.Len(t, tl, n0+2)
	checkMessages(t, c.events(t), tl[n0+1:])
}

// TestSeedContract checks the seed frontend's frames byte for byte on its
// path and on the older /v1 project paths.
func TestSeedContract(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.runningTask(t, "alice")
	n0 := len(e.timeline(t, id)) // the last is running's status_change
	tok := e.token(t, "alice")
	live := e.open(t, seedPath(id), tok, after(n0-1))
	e.runner(t, id).send(t, withSeqs(
		stage(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE),
		logLine("npm install completed in 47s"),
		&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"line one", "line <two> & \"three\""}}}},
		diff(3, 1, 1), usage(0.25),
		completed("https://github.com/owner/repo/pull/123", 123),
	)...)
	e.advance(t, id, task.Advance{Status: task.StatusDone, Actor: task.ActorGitHub, Reason: "pull request merged"})
	require.Len(t, e.timeline(t, id), n0+8)

	frames := []string{
		"id: %d\nevent: stage_change\ndata: {\"stage\":\"\",\"status\":\"running\"}\n\n",
		"id: %d\nevent: stage_change\ndata: {\"stage\":\"propose\",\"status\":\"running\"}\n\n",
		"id: %d\nevent: log\ndata: {\"tail\":\"npm install completed in 47s\"}\n\n",
		"id: %d\nevent: log\ndata: {\"tail\":\"line one\\nline <two> & \\\"three\\\"\"}\n\n",
		"", "", // diff_stats and usage are not part of the contract
		"id: %d\nevent: completed\ndata: {\"prUrl\":\"https://github.com/owner/repo/pull/123\"}\n\n",
		"id: %d\nevent: stage_change\ndata: {\"stage\":\"propose\",\"status\":\"awaiting_review\"}\n\n",
		"id: %d\nevent: stage_change\ndata: {\"stage\":\"propose\",\"status\":\"done\"}\n\n",
	}
	for i, f := range frames {
		if f != "" {
			frames[i] = fmt.Sprintf(f, n0+i)
		}
	}
	want := strings.Join(frames, "")
	require.Equal(t, want, live.rest(t), "live")
	for _, path := range []string{
		seedPath(id),
		"/projects/acme/widgets/branches/main/tasks/" + id + "/events",
		"/projects/Acme%2FWidgets/branches/taskrunner%2F" + id + "/tasks/" + id + "/events", // head branch
		"/v1/projects/acme%2Fwidgets/branches/main/tasks/" + id + "/events",
		"/v1/projects/acme/widgets/branches/main/tasks/" + id + "/events",
	} {
		t.Run(path, func(t *testing.T) {
			require.Equal(t, want, e.open(t, path, tok, after(n0-1)).rest(t), "replayed")
			require.Equal(t, strings.Join(frames[3:], ""), e.open(t, path, tok, after(n0+2)).rest(t), "resumed")
			require.Equal(t, strings.Join(frames[4:], ""), e.open(t, path+"?last_event_id="+strconv.Itoa(n0+3), tok, nil).rest(t), "resumed by parameter")
			require.Equal(t, http.StatusNoContent, e.status(t, path, tok, after(n0+8)))
		})
	}
	// The access_token parameter, as EventSource must use it.
	require.Equal(t, want, e.open(t, seedPath(id)+"?access_token="+url.QueryEscape(tok), "", after(n0-1)).rest(t))
}

// TestSeedContractFailure: a runner's failure is one failed message, with
// the redacted reason of the status_change, after the stage_change.
func TestSeedContractFailure(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.runningTask(t, "alice")
	n0 := len(e.timeline(t, id))
	tok := e.token(t, "alice")
	live := e.open(t, seedPath(id), tok, after(n0))
	e.runner(t, id).send(t, withSeqs(stage(taskrunnerv1.TaskStage_TASK_STAGE_APPLY),
		failed("tests failed; token ghp_abcdefghijklmnopqrstuvwxyz0123456789 leaked"))...)
	want := fmt.Sprintf("id: %d\nevent: stage_change\ndata: {\"stage\":\"apply\",\"status\":\"running\"}\n\n", n0+1) +
		"event: stage_change\ndata: {\"stage\":\"apply\",\"status\":\"failed\"}\n\n" +
		fmt.Sprintf("id: %d\nevent: failed\ndata: {\"reason\":\"tests failed; token [REDACTED] leaked\"}\n\n", n0+3)
	require.Equal(t, want, live.rest(t))
	require.Equal(t, want, e.open(t, seedPath(id), tok, after(n0)).rest(t))
	// A reconnect between the runner's failed (not sent by itself) and the end.
	require.Equal(t, want[strings.Index(want, "event: stage_change\ndata: {\"stage\":\"apply\",\"status\":\"failed"):],
		e.open(t, seedPath(id), tok, after(n0+2)).rest(t))
	require.Equal(t, http.StatusNoContent, e.status(t, seedPath(id), tok, after(n0+3)))
}

// TestMultiLineDataStaysOneEvent: an event whose JSON spans lines (CR, LF,
// CRLF) reaches the client as several data lines of one message.
func TestMultiLineDataStaysOneEvent(t *testing.T) {
	e := newEnv(t, sse.Config{}, envOptions{})
	id := e.newTask(t, "alice")
	n0 := len(e.timeline(t, id))
	c := e.open(t, eventsPath(id), e.token(t, "alice"), after(n0))
	// Once the marker is read the replay is over: the next event can only
	// come live (a replay would write its one-line JSON).
	e.emit(t, id, logLine("marker"))
	require.Equal(t, int64(n0+1), c.take(t, 1)[0].id)
	ev := e.appendTo(t, id, false, logLine("hello"))[0]
	b, err := eventwire.EncodeEvent(ev)
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(b, &v))
	pretty, err := json.MarshalIndent(v, "", "\r\n") // legal JSON whitespace
	require.NoError(t, err)
	pretty = []byte(strings.ReplaceAll(string(pretty), "\n\r\n", "\r\r\n"))
	require.Contains(t, string(pretty), "\r")
	msgBytes := eventwire.EncodeMessage(ev.GetSeq(), eventwire.TypeName(ev), false, pretty)
	require.NoError(t, e.rds.Client.Publish(context.Background(), eventwire.Channel(e.rds.Prefix, id), msgBytes).Err())

	m := c.take(t, 1)[0]
	require.Equal(t, int64(n0+2), m.id)
	require.Equal(t, "log", m.event)
	got, err := eventwire.DecodeEvent([]byte(m.data))
	require.NoError(t, err)
	require.True(t, proto.Equal(ev, got))
	require.Greater(t, strings.Count(m.data, "\n"), 3, "several data lines")
}

func TestSlowClientIsCutOffWithoutDelayingOthers(t *testing.T) {
	// A generous write timeout: the slow client must be cut because its
	// queue filled, not because a write timed out.
	e := newEnv(t, sse.Config{ClientQueue: 64, WriteTimeout: time.Minute}, envOptions{smallSendBuffer: true})
	id := e.newTask(t, "alice")
	n0 := len(e.timeline(t, id))
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
	fast := e.open(t, eventsPath(id), tok, after(n0))
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
	require.Equal(t, seqRange(int64(n0)+1, int64(n0)+n), ids(got))
	t.Logf("slowest burst of %d events reached the fast client in %s", burst, slowest)
	require.Less(t, slowest, 5*time.Second, "the fast client's deliveries stayed on time")
	// The slow one was dropped; the fast one is still open.
	require.Eventually(t, func() bool { return e.h.Subscribers() == 1 }, 10*time.Second, time.Millisecond)
	require.Equal(t, int64(1), e.h.CutOff(), "counted as cut off")

	e.cancelTask(t, id, tok, "enough")
	checkMessages(t, fast.events(t), e.timeline(t, id)[n0+n:])

	// What the slow client finally reads is a prefix without the end.
	rest, _ := io.ReadAll(slow) // ends with EOF or a reset
	require.NotContains(t, string(rest), "TASK_STATUS_CANCELLED")
	require.Less(t, strings.Count(string(rest), "event: log"), n)
}

func TestHeartbeat(t *testing.T) {
	e := newEnv(t, sse.Config{Heartbeat: 10 * time.Millisecond}, envOptions{})
	id := e.newTask(t, "alice")
	n0 := len(e.timeline(t, id))
	stillOpen(t, e.open(t, eventsPath(id), e.token(t, "alice"), after(n0)), 3)
	stillOpen(t, e.open(t, seedPath(id), e.token(t, "alice"), after(n0)), 3)
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
		{name: "seed: another owner", path: seedPath(id), hdr: map[string]string{"Authorization": "Bearer " + bob}, wantHTTP: 404, wantCode: 5},
		{name: "seed: another owner by parameter", path: seedPath(id) + "?access_token=" + url.QueryEscape(bob), wantHTTP: 404, wantCode: 5},
		{name: "seed: no token", path: seedPath(id), wantHTTP: 401, wantCode: 16},
		{name: "seed: other repository", path: "/projects/acme%2Fgadgets/branches/main/tasks/" + id + "/events", hdr: map[string]string{"Authorization": "Bearer " + alice}, wantHTTP: 404, wantCode: 5},
		{name: "seed: bad Last-Event-ID", path: seedPath(id), hdr: map[string]string{"Authorization": "Bearer " + alice, "Last-Event-ID": "-1"}, wantHTTP: 400, wantCode: 3},
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
	n0 := len(e.timeline(t, id))
	c := e.open(t, eventsPath(id), e.token(t, "alice"), after(n0))
	e.emit(t, id, logs(1, 2)...)
	require.Equal(t, seqRange(int64(n0)+1, int64(n0)+2), ids(c.take(t, 2)))
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
	e.emit(t, id, logLine("hello"))
	e.cancelTask(t, id, tok, "done here")
	want := e.timeline(t, id)
	c := e.open(t, eventsPath(id), tok, nil)
	require.NotEmpty(t, c.resp.Header.Get(rest.RequestIDHeader), "inside the request-id middleware")
	checkMessages(t, c.events(t), want)
	for _, path := range []string{seedPath(id), "/v1/projects/acme%2Fwidgets/branches/main/tasks/" + id + "/events"} {
		c := e.open(t, path, tok, nil)
		require.NotEmpty(t, c.resp.Header.Get(rest.RequestIDHeader), "inside the request-id middleware")
		require.Contains(t, c.rest(t), "\nevent: log\ndata: {\"tail\":\"hello\"}\n\n")
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
	require.Len(t, list.Events, len(want))
}
