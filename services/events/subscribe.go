package events

import (
	"context"
	"encoding/base64"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/task"
)

// Paging limits of ListEvents, and the page size of replays. A page also
// stops before MaxPageBytes of payload (see Store.Page): a client that asks
// for MaxPageSize events of a task with long logs gets fewer, and a
// next_page_token.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
	replayPage      = 500
)

// ownedTask checks the caller's scope and that the task is the caller's:
// another owner's task is NotFound, like a missing one.
func (s *Server) ownedTask(ctx context.Context, id string) (task.Task, error) {
	p, err := auth.RequireScope(ctx, auth.ScopeTasks)
	if err != nil {
		return task.Task{}, err
	}
	if err := task.ValidateID("task_id", id); err != nil {
		return task.Task{}, err
	}
	return s.tasks.Get(ctx, id, p.Owner)
}

// Subscribe implements EventsService: it subscribes to the task's Redis
// channel first, then replays stored events after after_seq, then streams
// live ones, dropping duplicates by seq and filling any gap from the
// database, until the status_change into done, failed or cancelled (it
// stays open while the task awaits review).
func (s *Server) Subscribe(req *taskrunnerv1.SubscribeRequest, stream grpc.ServerStreamingServer[taskrunnerv1.SubscribeResponse]) error {
	ctx := stream.Context()
	id := req.GetTaskId()
	if _, err := s.ownedTask(ctx, id); err != nil {
		return err
	}
	if req.GetAfterSeq() < 0 {
		return errs.Invalid("after_seq", "must not be negative")
	}
	ps := s.rdb.Subscribe(ctx, eventwire.Channel(s.cfg.RedisPrefix, id))
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		return status.Error(codes.Unavailable, "event fan-out is unavailable")
	}
	live := ps.Channel(redis.WithChannelSize(1024))

	last := req.GetAfterSeq()
	send := func(e *taskrunnerv1.Event) error {
		last = e.GetSeq()
		return stream.Send(&taskrunnerv1.SubscribeResponse{TaskId: id, Event: e})
	}
	// replay sends every stored event after last; ended is true after the
	// terminal event.
	replay := func() (ended bool, err error) {
		for {
			recs, more, err := s.store.Page(ctx, id, last, replayPage, s.cfg.maxPageBytes())
			if err != nil {
				return false, err
			}
			for _, r := range recs {
				e, err := eventwire.DecodeEvent(r.Payload)
				if err != nil {
					return false, err
				}
				if err := send(e); err != nil {
					return false, err
				}
				if eventwire.Final(e) {
					return true, nil
				}
			}
			if !more {
				return false, nil
			}
		}
	}
	// over replays what is left once the task has finished (a task that
	// finished before its timeline had status_change events ends there).
	over := func() (bool, error) {
		t, err := s.tasks.Get(ctx, id, "")
		if err != nil || !t.Status.Terminal() {
			return false, err
		}
		_, err = replay()
		return true, err
	}

	if ended, err := replay(); ended || err != nil {
		return err
	}
	if ended, err := over(); ended || err != nil {
		return err
	}
	check := time.NewTicker(s.cfg.HeartbeatInterval)
	defer check.Stop()
	for {
		select {
		case m, ok := <-live:
			if !ok {
				return status.Error(codes.Unavailable, "event fan-out closed")
			}
			msg, err := eventwire.DecodeMessage([]byte(m.Payload))
			var e *taskrunnerv1.Event
			if err == nil {
				e, err = eventwire.DecodeEvent(msg.Payload)
			}
			if err != nil {
				s.log.WarnContext(ctx, "events: undecodable message on channel", "channel", m.Channel, "error", err)
				continue
			}
			switch {
			case e.GetSeq() <= last:
				continue // already sent (replay overlap)
			case e.GetSeq() > last+1:
				// A message was missed (or the replay is behind): the
				// database holds everything up to e.
				if ended, err := replay(); ended || err != nil {
					return err
				}
				continue
			}
			if err := send(e); err != nil {
				return err
			}
			if eventwire.Final(e) {
				return nil
			}
		case <-check.C:
			// A task can end without a terminal event (user cancel, reaper).
			if ended, err := over(); ended || err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
			return errShuttingDown
		}
	}
}

// ListEvents implements EventsService: one page of stored events, oldest
// first. The page token is opaque to clients.
func (s *Server) ListEvents(ctx context.Context, req *taskrunnerv1.ListEventsRequest) (*taskrunnerv1.ListEventsResponse, error) {
	if _, err := s.ownedTask(ctx, req.GetTaskId()); err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = DefaultPageSize
	case size < 1 || size > MaxPageSize:
		return nil, errs.Invalid("page_size", "must be between 1 and %d, got %d", MaxPageSize, size)
	}
	after := req.GetAfterSeq()
	if after < 0 {
		return nil, errs.Invalid("after_seq", "must not be negative")
	}
	if tok := req.GetPageToken(); tok != "" {
		seq, err := decodePageToken(tok)
		if err != nil {
			return nil, err
		}
		after = max(after, seq)
	}
	recs, more, err := s.store.Page(ctx, req.GetTaskId(), after, size, s.cfg.maxPageBytes())
	if err != nil {
		return nil, err
	}
	out := &taskrunnerv1.ListEventsResponse{}
	if more {
		out.NextPageToken = encodePageToken(recs[len(recs)-1].Seq)
	}
	for _, r := range recs {
		e, err := eventwire.DecodeEvent(r.Payload)
		if err != nil {
			return nil, err
		}
		out.Events = append(out.Events, e)
	}
	return out, nil
}

const pageTokenPrefix = "ev1:"

func encodePageToken(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + strconv.FormatInt(seq, 10)))
}

func decodePageToken(tok string) (int64, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err == nil && len(b) > len(pageTokenPrefix) && string(b[:len(pageTokenPrefix)]) == pageTokenPrefix {
		if seq, err := strconv.ParseInt(string(b[len(pageTokenPrefix):]), 10, 64); err == nil && seq >= 0 {
			return seq, nil
		}
	}
	return 0, errs.Invalid("page_token", "is not a token returned by ListEvents")
}
