package events_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/events"
)

// bigLog is a log event of about n bytes in 10 lines.
func bigLog(i, n int) *taskrunnerv1.Event {
	lines := make([]string, 10)
	for j := range lines {
		lines[j] = fmt.Sprintf("%04d/%d ", i, j) + strings.Repeat(string(rune('a'+(i+j)%26)), n/10)
	}
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: lines}}}
}

// A task of 256 events totalling more than 5 MB (issue 19's case): pages of
// the largest size stop by bytes under gRPC's 4 MiB limit, the page tokens
// continue gap-free to the end, and Subscribe replays the whole task from 0.
func TestListEventsAndReplayPageByBytes(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	var evs []*taskrunnerv1.Event
	for i := range 255 {
		evs = append(evs, bigLog(i, 21_000))
	}
	evs = append(evs, completed("https://github.com/acme/widgets/pull/7", 7))
	sendAll(t, e.runner(t, in.addr, id), evs)
	// created, running, 256 runner events, awaiting_review.
	const total = 259

	client := e.userConn(t, in.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctx = e.as(t, ctx, "alice")

	req := &taskrunnerv1.ListEventsRequest{TaskId: id, PageSize: events.MaxPageSize}
	var seqs []int64
	pages, bytes := 0, 0
	for {
		resp, err := client.ListEvents(ctx, req)
		require.NoError(t, err, "a page of the largest size must never be ResourceExhausted")
		pages++
		size := proto.Size(resp)
		bytes += size
		require.Less(t, size, 4<<20, "page %d is %d bytes", pages, size)
		require.NotEmpty(t, resp.GetEvents())
		for _, ev := range resp.GetEvents() {
			seqs = append(seqs, ev.GetSeq())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	require.Equal(t, seqRange(1, total), seqs)
	require.Greater(t, bytes, 5<<20, "the task is over 5 MB")
	require.GreaterOrEqual(t, pages, 2, "a 5 MB task does not fit one page")

	stream, err := client.Subscribe(ctx, &taskrunnerv1.SubscribeRequest{TaskId: id})
	require.NoError(t, err)
	// The task awaits review, so the stream stays open: read all of it.
	for want := int64(1); want <= total; want++ {
		require.Equal(t, want, mustRecv(t, stream).GetEvent().GetSeq())
	}
}

// Page's edges with a small byte budget: at least one event per page even
// when it alone is over the budget, a cut exactly at the budget, and the
// count limit still applies.
func TestStorePageEdges(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	var evs []*taskrunnerv1.Event
	for i := range 6 {
		evs = append(evs, bigLog(i, 2000))
	}
	sendAll(t, e.runner(t, in.addr, id), evs)
	st := in.srv.Store()
	ctx := context.Background()
	all, more, err := st.Page(ctx, id, 2, 100, events.MaxPageBytes)
	require.NoError(t, err)
	require.False(t, more)
	require.Len(t, all, 6)
	one := len(all[0].Payload) // jsonb's normal form, as the query measures it

	for _, tc := range []struct {
		name       string
		limit, max int
		wantSeqs   []int64
		wantMore   bool
	}{
		{"one over the budget", 100, 10, []int64{3}, true},
		{"two fit exactly", 100, 2*one + 2, []int64{3, 4}, true},
		{"count first", 2, events.MaxPageBytes, []int64{3, 4}, true},
		{"all fit", 100, 100 * one, []int64{3, 4, 5, 6, 7, 8}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, more, err := st.Page(ctx, id, 2, tc.limit, tc.max)
			require.NoError(t, err)
			var got []int64
			for _, r := range recs {
				got = append(got, r.Seq)
			}
			require.Equal(t, tc.wantSeqs, got)
			require.Equal(t, tc.wantMore, more)
		})
	}
}
