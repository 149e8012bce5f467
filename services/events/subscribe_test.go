package events_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/task"
)

// sendAll streams evs through a runner client and waits for their acks.
func sendAll(t *testing.T, c interface {
	Send(*taskrunnerv1.Event) (int64, error)
	Acked() int64
}, evs []*taskrunnerv1.Event) {
	t.Helper()
	var last int64
	for _, ev := range evs {
		seq, err := c.Send(ev)
		require.NoError(t, err)
		last = seq
	}
	require.Eventually(t, func() bool { return c.Acked() == last }, 20*time.Second, time.Millisecond)
}

// receiveAll reads a Subscribe stream to its end and returns the seqs.
func receiveAll(t *testing.T, stream interface {
	Recv() (*taskrunnerv1.SubscribeResponse, error)
}, taskID string) []int64 {
	t.Helper()
	var seqs []int64
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return seqs
		}
		require.NoError(t, err)
		require.Equal(t, taskID, m.GetTaskId())
		seqs = append(seqs, m.GetEvent().GetSeq())
	}
}

func TestSubscribeReplaysThenFollowsLive(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	evs, _ := workload(60, completed("https://github.com/acme/widgets/pull/5", 5))
	c := e.runner(t, in.addr, id)
	sendAll(t, c, evs[:20])

	client := e.userConn(t, in.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The timeline: created (1), running (2), the runner's 60 events
	// (3..62), the status change to awaiting_review (63).
	stream, err := client.Subscribe(e.as(t, ctx, "alice"), &taskrunnerv1.SubscribeRequest{TaskId: id, AfterSeq: 4})
	require.NoError(t, err)
	// History first: 5..22.
	for want := int64(5); want <= 22; want++ {
		m, err := stream.Recv()
		require.NoError(t, err)
		require.Equal(t, want, m.GetEvent().GetSeq())
	}
	// Then live, including events sent while nobody reads; the stream
	// stays open while the task awaits review, and ends at done.
	sendAll(t, c, evs[20:])
	for want := int64(23); want <= 62; want++ {
		m, err := stream.Recv()
		require.NoError(t, err)
		require.Equal(t, want, m.GetEvent().GetSeq())
	}
	sc := mustRecv(t, stream).GetEvent().GetStatusChange()
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW, sc.GetTo())
	require.Equal(t, "runner", sc.GetActor())
	// 63 was that status change; merging appends 64.
	_, _, err = e.tasks.WithPublisher(task.NewRedisPublisher(e.rds.Client, e.rds.Prefix, nil)).Advance(context.Background(), id, "",
		task.Advance{Status: task.StatusDone, RequestID: "merge", Actor: task.ActorGitHub, Reason: "pull request merged"})
	require.NoError(t, err)
	require.Equal(t, []int64{64}, receiveAll(t, stream, id), "done is pushed, then the stream ends")

	// A finished task: the replay is the whole story.
	again, err := client.Subscribe(e.as(t, ctx, "alice"), &taskrunnerv1.SubscribeRequest{TaskId: id})
	require.NoError(t, err)
	require.Equal(t, seqRange(1, 64), receiveAll(t, again, id))
}

func mustRecv(t *testing.T, stream interface {
	Recv() (*taskrunnerv1.SubscribeResponse, error)
}) *taskrunnerv1.SubscribeResponse {
	t.Helper()
	m, err := stream.Recv()
	require.NoError(t, err)
	return m
}

func TestSubscribeEndsAtTheReapersStatusChange(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	c := e.runner(t, in.addr, id)
	sendAll(t, c, []*taskrunnerv1.Event{stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE), logLine("hello")})
	// The reaper fails the task; no runner event says so.
	_, _, err := e.tasks.Advance(context.Background(), id, "", task.Advance{Status: task.StatusFailed, FailedReason: "runner_lost", RequestID: "reaper", Actor: task.ActorReaper})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := e.userConn(t, in.addr).Subscribe(e.as(t, ctx, "alice"), &taskrunnerv1.SubscribeRequest{TaskId: id})
	require.NoError(t, err)
	var got []*taskrunnerv1.Event
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got = append(got, m.GetEvent())
	}
	require.Len(t, got, 5) // created, running, stage, log, failed
	last := got[4].GetStatusChange()
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, last.GetTo())
	require.Equal(t, "reaper", last.GetActor())
	require.Equal(t, "runner_lost", last.GetReason())
}

func TestEventsAreOwnerChecked(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	client := e.userConn(t, in.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cases := []struct {
		name string
		ctx  context.Context
		id   string
		want codes.Code
	}{
		{name: "another owner", ctx: e.as(t, ctx, "bob"), id: id, want: codes.NotFound},
		{name: "missing task", ctx: e.as(t, ctx, "alice"), id: "6f1c1c9e-9d7e-4a39-9d0e-3b8f0b1c2d3e", want: codes.NotFound},
		{name: "no token", ctx: ctx, id: id, want: codes.Unauthenticated},
		{name: "not an id", ctx: e.as(t, ctx, "alice"), id: "nope", want: codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := client.Subscribe(tc.ctx, &taskrunnerv1.SubscribeRequest{TaskId: tc.id})
			require.NoError(t, err)
			_, err = stream.Recv()
			require.Equal(t, tc.want, status.Code(err), "%v", err)
			_, err = client.ListEvents(tc.ctx, &taskrunnerv1.ListEventsRequest{TaskId: tc.id})
			require.Equal(t, tc.want, status.Code(err), "%v", err)
		})
	}
}

func TestListEventsPages(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	evs, _ := workload(25, logLine("still going"))
	sendAll(t, e.runner(t, in.addr, id), evs)
	client := e.userConn(t, in.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx = e.as(t, ctx, "alice")

	cases := []struct {
		name     string
		req      *taskrunnerv1.ListEventsRequest
		want     [][2]int64 // first and last seq of each page
		wantCode codes.Code
	}{
		// 27 events: created, running and the runner's 25.
		{name: "pages of 10", req: &taskrunnerv1.ListEventsRequest{PageSize: 10}, want: [][2]int64{{1, 10}, {11, 20}, {21, 27}}},
		{name: "default page size", req: &taskrunnerv1.ListEventsRequest{}, want: [][2]int64{{1, 27}}},
		{name: "exact multiple", req: &taskrunnerv1.ListEventsRequest{PageSize: 5, AfterSeq: 17}, want: [][2]int64{{18, 22}, {23, 27}}},
		{name: "after the end", req: &taskrunnerv1.ListEventsRequest{AfterSeq: 27}, want: [][2]int64{{0, 0}}},
		{name: "page too large", req: &taskrunnerv1.ListEventsRequest{PageSize: 1001}, wantCode: codes.InvalidArgument},
		{name: "negative page", req: &taskrunnerv1.ListEventsRequest{PageSize: -1}, wantCode: codes.InvalidArgument},
		{name: "forged token", req: &taskrunnerv1.ListEventsRequest{PageToken: "seq=5"}, wantCode: codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.TaskId = id
			var got [][2]int64
			for {
				resp, err := client.ListEvents(ctx, req)
				if tc.wantCode != codes.OK {
					require.Equal(t, tc.wantCode, status.Code(err), "%v", err)
					return
				}
				require.NoError(t, err)
				var page [2]int64
				for i, ev := range resp.GetEvents() {
					if i == 0 {
						page[0] = ev.GetSeq()
					} else {
						require.Equal(t, page[1]+1, ev.GetSeq())
					}
					page[1] = ev.GetSeq()
				}
				got = append(got, page)
				if resp.GetNextPageToken() == "" {
					break
				}
				req.PageToken = resp.GetNextPageToken()
			}
			require.Equal(t, tc.want, got)
		})
	}
}
