package events

import (
	"context"
	"encoding/base64"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	"github.com/taskrunner/taskrunner/platform/follow"
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

	// Server.Close ends the stream with Unavailable.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(s.ctx, func() { cancel(errShuttingDown) })()
	err := follow.Follow(ctx, redisFeed(live), storePages{s, id}, subscribeSink{stream, id}, follow.Options{
		After:      req.GetAfterSeq(),
		Finished:   func(ctx context.Context) (bool, error) { return s.finished(ctx, id) },
		CheckEvery: s.cfg.HeartbeatInterval,
		Dropped: func(err error) {
			s.log.WarnContext(ctx, "events: undecodable message on channel", "task_id", id, "error", err)
		},
		Gap: func(after, seq int64) {
			s.log.WarnContext(ctx, "events: events missing from the log", "task_id", id, "after", after, "seq", seq)
		},
	})
	if errors.Is(err, follow.ErrFeedClosed) {
		return status.Error(codes.Unavailable, "event fan-out closed")
	}
	return err
}

// finished reports whether the task has finished: Subscribe's safety net
// for a task that ends without a final event (user cancel, reaper, a
// timeline written before status_change existed).
func (s *Server) finished(ctx context.Context, id string) (bool, error) {
	t, err := s.tasks.Get(ctx, id, "")
	if err != nil {
		return false, err
	}
	return t.Status.Terminal(), nil
}

// redisFeed is a task's Redis channel as Subscribe's live feed.
type redisFeed <-chan *redis.Message

func (f redisFeed) Messages() <-chan *redis.Message { return f }

func (redisFeed) Decode(m *redis.Message) (*taskrunnerv1.Event, error) {
	msg, err := eventwire.DecodeMessage([]byte(m.Payload))
	if err != nil {
		return nil, err
	}
	return eventwire.DecodeEvent(msg.Payload)
}

// storePages reads a task's stored timeline in replay pages.
type storePages struct {
	s  *Server
	id string
}

func (p storePages) Page(ctx context.Context, after int64) ([]*taskrunnerv1.Event, bool, error) {
	recs, more, err := p.s.store.Page(ctx, p.id, after, replayPage, p.s.cfg.maxPageBytes())
	if err != nil {
		return nil, false, err
	}
	events := make([]*taskrunnerv1.Event, 0, len(recs))
	for _, r := range recs {
		e, err := eventwire.DecodeEvent(r.Payload)
		if err != nil {
			return nil, false, err
		}
		events = append(events, e)
	}
	return events, more, nil
}

// subscribeSink sends events on a Subscribe stream.
type subscribeSink struct {
	stream grpc.ServerStreamingServer[taskrunnerv1.SubscribeResponse]
	id     string
}

func (k subscribeSink) Send(e *taskrunnerv1.Event) error {
	return k.stream.Send(&taskrunnerv1.SubscribeResponse{TaskId: k.id, Event: e})
}

// ListEvents implements EventsService: one page of stored events, oldest
// first. The page token is opaque to clients.
func (s *Server) ListEvents(ctx context.Context, req *taskrunnerv1.ListEventsRequest) (*taskrunnerv1.ListEventsResponse, error) {
	p, err := auth.RequireScope(ctx, auth.ScopeTasks)
	if err != nil {
		return nil, err
	}
	if err := task.ValidateID("task_id", req.GetTaskId()); err != nil {
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
	// The owner check and the page in one round trip: another owner's task
	// is NotFound, like a missing one.
	recs, more, err := s.store.OwnedPage(ctx, req.GetTaskId(), p.Owner, after, size, s.cfg.maxPageBytes())
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
