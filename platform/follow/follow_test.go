package follow

import (
	"context"
	"errors"
	"testing"
	"time"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name      string
		last, seq int64
		want      Action
		afterFill Action
	}{
		{"first event", 0, 1, Deliver, Deliver},
		{"next event", 4, 5, Deliver, Deliver},
		{"duplicate", 5, 5, Skip, Skip},
		{"older (replay overlap)", 5, 3, Skip, Skip},
		{"gap of one", 4, 6, Fill, Deliver},
		{"gap from the start", 0, 9, Fill, Deliver},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.last, tc.seq); got != tc.want {
				t.Errorf("Next(%d, %d) = %v, want %v", tc.last, tc.seq, got, tc.want)
			}
			if got := AfterFill(tc.last, tc.seq); got != tc.afterFill {
				t.Errorf("AfterFill(%d, %d) = %v, want %v", tc.last, tc.seq, got, tc.afterFill)
			}
		})
	}
}

func ev(seq int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Seq: seq, Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{}}}
}

func final(seq int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Seq: seq, Payload: &taskrunnerv1.Event_StatusChange{StatusChange: &taskrunnerv1.StatusChange{To: taskrunnerv1.TaskStatus_TASK_STATUS_DONE}}}
}

type chanFeed chan *taskrunnerv1.Event

func (c chanFeed) Messages() <-chan *taskrunnerv1.Event { return c }
func (c chanFeed) Decode(e *taskrunnerv1.Event) (*taskrunnerv1.Event, error) {
	if e == nil {
		return nil, errors.New("bad")
	}
	return e, nil
}

// store is a timeline that grows as the test appends, paged by 2.
type store struct{ events []*taskrunnerv1.Event }

func (s *store) Page(_ context.Context, after int64) ([]*taskrunnerv1.Event, bool, error) {
	var out []*taskrunnerv1.Event
	for _, e := range s.events {
		if e.GetSeq() > after && len(out) < 2 {
			out = append(out, e)
		}
	}
	return out, len(out) == 2, nil
}

type sink []int64

func (s *sink) Send(e *taskrunnerv1.Event) error { *s = append(*s, e.GetSeq()); return nil }

func TestFollow(t *testing.T) {
	st := &store{events: []*taskrunnerv1.Event{ev(1), ev(2), ev(3)}}
	feed := make(chanFeed, 16)
	// Live: a duplicate of the replay, an undecodable message, a gap (4 and
	// 5 only in the store), the next one, the final one, and one after it.
	st.events = append(st.events, ev(4), ev(5), ev(6), ev(7), final(8))
	for _, e := range []*taskrunnerv1.Event{ev(3), nil, ev(6), ev(7), final(8), ev(9)} {
		feed <- e
	}
	var got sink
	dropped := 0
	err := Follow(context.Background(), feed, st, &got, Options{After: 1, CheckEvery: time.Hour,
		Finished: func(context.Context) (bool, error) { return false, nil }, Dropped: func(error) { dropped++ }})
	if err != nil {
		t.Fatal(err)
	}
	// The first replay already reaches the final event.
	want := []int64{2, 3, 4, 5, 6, 7, 8}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if dropped != 0 {
		t.Errorf("dropped %d: the first replay reached the final event", dropped)
	}
}

func TestFollowLive(t *testing.T) {
	st := &store{events: []*taskrunnerv1.Event{ev(1), ev(2)}}
	// 4 is in the store only (a missed message); 6 is missing from it too.
	st.events = append(st.events, ev(3), ev(4), ev(5))
	var got sink
	var dropped int
	var gaps [][2]int64
	// Replay sees 1 and 2 only; the store grows before the live events are read.
	pages := &store{events: st.events[:2]}
	feed := make(chanFeed, 16)
	for _, e := range []*taskrunnerv1.Event{ev(2), nil, ev(3), ev(5), ev(7), final(8), ev(9)} {
		feed <- e
	}
	first := true
	err := Follow(context.Background(), feed, pagesFunc(func(ctx context.Context, after int64) ([]*taskrunnerv1.Event, bool, error) {
		if !first {
			pages.events = st.events
		}
		first = false
		return pages.Page(ctx, after)
	}), &got, Options{CheckEvery: time.Hour,
		Dropped: func(error) { dropped++ }, Gap: func(a, s int64) { gaps = append(gaps, [2]int64{a, s}) }})
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{1, 2, 3, 4, 5, 7, 8}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if dropped != 1 || len(gaps) != 1 || gaps[0] != [2]int64{5, 7} {
		t.Errorf("dropped %d, gaps %v; want 1, [[5 7]]", dropped, gaps)
	}
}

type pagesFunc func(context.Context, int64) ([]*taskrunnerv1.Event, bool, error)

func (f pagesFunc) Page(ctx context.Context, after int64) ([]*taskrunnerv1.Event, bool, error) {
	return f(ctx, after)
}

func TestFollowEndsWhenFinished(t *testing.T) {
	var got sink
	err := Follow(context.Background(), make(chanFeed), &store{events: []*taskrunnerv1.Event{ev(1)}}, &got,
		Options{CheckEvery: time.Hour, Finished: func(context.Context) (bool, error) { return true, nil }})
	if err != nil || len(got) != 1 {
		t.Fatalf("got %v, %v; want [1], nil", got, err)
	}
	feed := make(chanFeed)
	close(feed)
	if err := Follow(context.Background(), feed, &store{}, &got, Options{CheckEvery: time.Hour}); !errors.Is(err, ErrFeedClosed) {
		t.Fatalf("closed feed: %v", err)
	}
}
