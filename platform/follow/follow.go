// Package follow is the one "follow a task" algorithm: subscribe to the
// task's live feed first, replay the stored timeline after the last seq,
// then deliver live events, dropping duplicates by seq, filling gaps from
// the store (nothing is published before it is committed, so the store
// holds everything up to a live event), and ending after the final event
// (eventwire.Final). EventsService.Subscribe runs Follow; the gateway's SSE
// stream, which keeps its own shared ring per task, pooled buffers and seed
// view, uses Next for the same seq decision.
package follow

import (
	"context"
	"errors"
	"time"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Action is what a follower does with an event, given the last seq it
// delivered.
type Action int

const (
	// Skip: delivered already (a replay overlapping the live feed, or a
	// resend).
	Skip Action = iota
	// Deliver: the next event of the timeline.
	Deliver
	// Fill: events between are missing here; replay them from the store
	// first, then decide again (see AfterFill).
	Fill
)

// Next decides what a follower that delivered every event up to last does
// with the event numbered seq.
func Next(last, seq int64) Action {
	switch {
	case seq <= last:
		return Skip
	case seq > last+1:
		return Fill
	default:
		return Deliver
	}
}

// AfterFill decides again after a Fill replayed the store: the event is
// Skip if the replay covered it, otherwise Deliver — also when events
// before it are still missing from the store (the caller may log that gap),
// so a follower never stalls on a hole.
func AfterFill(last, seq int64) Action {
	if seq <= last {
		return Skip
	}
	return Deliver
}

// Feed is the live side: messages published on the task's channel after
// the follower subscribed. Subscribe before calling Follow.
type Feed[M any] interface {
	// Messages is closed when the subscription ends.
	Messages() <-chan M
	// Decode turns a message into its event; an error drops the message.
	Decode(M) (*taskrunnerv1.Event, error)
}

// Pages reads the stored timeline.
type Pages interface {
	// Page answers stored events after seq after, oldest first, and whether
	// more follow.
	Page(ctx context.Context, after int64) (events []*taskrunnerv1.Event, more bool, err error)
}

// Sink receives the events, each once, in seq order.
type Sink interface {
	Send(*taskrunnerv1.Event) error
}

// Options of Follow.
type Options struct {
	// After is the last seq the client has (0: the whole timeline).
	After int64
	// Finished reports whether the task has finished; it is the safety net
	// of a task that ended without a final event on its timeline (after the
	// first replay and every CheckEvery): Follow then replays what is left
	// and ends.
	Finished   func(context.Context) (bool, error)
	CheckEvery time.Duration
	// Dropped, if set, hears about a live message that did not decode.
	Dropped func(error)
	// Gap, if set, hears about a live event delivered although the store
	// lacked events before it (after, seq).
	Gap func(after, seq int64)
}

// ErrFeedClosed is returned when the live feed closes before the end.
var ErrFeedClosed = errors.New("follow: the live feed closed")

// Follow delivers the task's timeline after o.After to sink until the
// final event (nil), ctx ends (context.Cause(ctx)), the feed closes
// (ErrFeedClosed) or pages or sink fail (their error).
func Follow[M any](ctx context.Context, feed Feed[M], pages Pages, sink Sink, o Options) error {
	f := follower{pages: pages, sink: sink, last: o.After}
	if ended, err := f.replay(ctx); ended || err != nil {
		return err
	}
	if ended, err := f.over(ctx, o.Finished); ended || err != nil {
		return err
	}
	check := time.NewTicker(o.CheckEvery)
	defer check.Stop()
	live := feed.Messages()
	for {
		select {
		case m, ok := <-live:
			if !ok {
				return ErrFeedClosed
			}
			e, err := feed.Decode(m)
			if err != nil {
				if o.Dropped != nil {
					o.Dropped(err)
				}
				continue
			}
			ended, err := f.live(ctx, e, o.Gap)
			if ended || err != nil {
				return err
			}
		case <-check.C:
			if ended, err := f.over(ctx, o.Finished); ended || err != nil {
				return err
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

type follower struct {
	pages Pages
	sink  Sink
	last  int64 // highest seq delivered
}

func (f *follower) send(e *taskrunnerv1.Event) (ended bool, err error) {
	if err := f.sink.Send(e); err != nil {
		return false, err
	}
	f.last = e.GetSeq()
	return eventwire.Final(e), nil
}

// live handles one live event.
func (f *follower) live(ctx context.Context, e *taskrunnerv1.Event, gap func(after, seq int64)) (ended bool, err error) {
	switch Next(f.last, e.GetSeq()) {
	case Skip:
		return false, nil
	case Fill:
		if ended, err := f.replay(ctx); ended || err != nil {
			return ended, err
		}
		if AfterFill(f.last, e.GetSeq()) == Skip {
			return false, nil
		}
		if gap != nil {
			gap(f.last, e.GetSeq())
		}
	}
	return f.send(e)
}

// replay delivers every stored event after f.last; ended is true after the
// final event.
func (f *follower) replay(ctx context.Context) (ended bool, err error) {
	for {
		events, more, err := f.pages.Page(ctx, f.last)
		if err != nil {
			return false, err
		}
		for _, e := range events {
			if Next(f.last, e.GetSeq()) == Skip {
				continue
			}
			if ended, err := f.send(e); ended || err != nil {
				return ended, err
			}
		}
		if !more || len(events) == 0 {
			return false, nil
		}
	}
}

// over replays what is left once the task has finished (a task that
// finished before its timeline had final events ends there).
func (f *follower) over(ctx context.Context, finished func(context.Context) (bool, error)) (bool, error) {
	if finished == nil {
		return false, nil
	}
	done, err := finished(ctx)
	if err != nil || !done {
		return false, err
	}
	_, err = f.replay(ctx)
	return true, err
}
