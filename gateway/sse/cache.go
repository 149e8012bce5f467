package sse

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// A connect storm (a deploy, a gateway restart, a popular task) would call
// GetTask and ListEvents once per connection. lookups shares those calls
// between connections of the same token and task:
//
//   - GetTask answers (the task, or NotFound / Unauthenticated /
//     PermissionDenied / InvalidArgument) are kept for AuthTTL, a few
//     seconds: a revoked token or a changed owner is refused within that
//     time, by the next connect or the next status check. Errors that say
//     nothing about the caller (Unavailable …) are not kept. The owner
//     check itself is TaskService's, on the caller's own token, as before:
//     an answer is only ever shared with the same token.
//   - ListEvents pages are shared only when the call started after the
//     task's Redis subscription was confirmed (the topic's readyAt): such a
//     page holds every event committed before that moment, and every event
//     committed after it reached the hub. Those the hub saw before the
//     joining stream was there do not come to it live, so a stream whose
//     replay ends below the highest seq the hub had seen replays again,
//     unshared (stream.run). Pages are kept for AuthTTL as well.
//
// Calls run under a context of their own (the caller's token and request
// id, not its cancellation), so a client that leaves does not fail the
// others waiting on its call.
type lookups struct {
	ttl     time.Duration
	timeout time.Duration
	now     func() time.Time

	mu     sync.Mutex
	tasks  map[taskKey]*call[*taskrunnerv1.Task]
	pages  map[pageKey]*call[*page]
	sweeps int // inserts since the last sweep
}

type tokenHash [sha256.Size]byte

type taskKey struct {
	token tokenHash
	task  string
}

type pageKey struct {
	taskKey
	after int64
	size  int32
}

// call is one shared lookup: done closes when val and err are set.
type call[T any] struct {
	start   time.Time
	done    chan struct{}
	val     T
	err     error
	expires time.Time // set when done; zero: not kept
}

// maxEntries bounds each map; past it, expired entries are swept, and if
// that is not enough the map starts over (correctness never depends on a
// hit).
const maxEntries = 50000

func newLookups(ttl, timeout time.Duration) *lookups {
	return &lookups{ttl: ttl, timeout: timeout, now: time.Now,
		tasks: map[taskKey]*call[*taskrunnerv1.Task]{}, pages: map[pageKey]*call[*page]{}}
}

func hashToken(tok string) tokenHash { return sha256.Sum256([]byte(tok)) }

// cacheable reports whether err is an answer about the caller (kept) or
// about the path to the service (not kept).
func cacheable(err error) bool {
	switch status.Code(err) {
	case codes.OK, codes.NotFound, codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument:
		return true
	}
	return false
}

// share returns the result of the call under key, starting it unless a
// usable one exists: usable(c) decides, for a call in flight or kept.
func share[K comparable, T any](l *lookups, m map[K]*call[T], key K, usable func(*call[T]) bool,
	ctx context.Context, fetch func(context.Context) (T, error)) (T, error) {
	now := l.now()
	l.mu.Lock()
	c := m[key]
	if c != nil {
		select {
		case <-c.done:
			if c.expires.IsZero() || !now.Before(c.expires) {
				c = nil
			}
		default:
		}
	}
	if c != nil && !usable(c) {
		c = nil
	}
	if c == nil {
		c = &call[T]{start: now, done: make(chan struct{})}
		l.sweepLocked(now, len(m), func() {
			for k, old := range m {
				select {
				case <-old.done:
					if old.expires.IsZero() || !now.Before(old.expires) {
						delete(m, k)
					}
				default:
				}
			}
			if len(m) >= maxEntries {
				clear(m)
			}
		})
		m[key] = c
		l.mu.Unlock()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
		c.val, c.err = fetch(fctx)
		cancel()
		if l.ttl > 0 && cacheable(c.err) {
			c.expires = l.now().Add(l.ttl)
		}
		close(c.done)
		return c.val, c.err
	}
	l.mu.Unlock()
	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		var zero T
		return zero, status.FromContextError(ctx.Err()).Err()
	}
}

func (l *lookups) sweepLocked(now time.Time, size int, sweep func()) {
	l.sweeps++
	if size < maxEntries && l.sweeps < 4096 {
		return
	}
	l.sweeps = 0
	sweep()
}

// task is GetTask of id with tok (carried by ctx), basic view, shared for
// the TTL.
func (l *lookups) task(ctx context.Context, tasks taskrunnerv1.TaskServiceClient, tok tokenHash, id string) (*taskrunnerv1.Task, error) {
	return share(l, l.tasks, taskKey{tok, id}, func(*call[*taskrunnerv1.Task]) bool { return true }, ctx,
		func(ctx context.Context) (*taskrunnerv1.Task, error) {
			// The basic view: a stream needs the status, not the runs.
			resp, err := tasks.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id, View: taskrunnerv1.TaskView_TASK_VIEW_BASIC})
			return resp.GetTask(), err
		})
}

// forget drops the kept GetTask answer, so the next lookup asks again (a
// status check must see the task as it is now, within the TTL).
func (l *lookups) forget(tok tokenHash, id string) {
	l.mu.Lock()
	delete(l.tasks, taskKey{tok, id})
	l.mu.Unlock()
}

// page is one ListEvents page, shared with streams whose subscription was
// confirmed before the call started (see lookups).
func (l *lookups) page(ctx context.Context, events taskrunnerv1.EventsServiceClient, tok tokenHash, req *taskrunnerv1.ListEventsRequest,
	subscribed time.Time) (*page, error) {
	key := pageKey{taskKey{tok, req.GetTaskId()}, req.GetAfterSeq(), req.GetPageSize()}
	req = proto.Clone(req).(*taskrunnerv1.ListEventsRequest)
	return share(l, l.pages, key, func(c *call[*page]) bool { return c.start.After(subscribed) }, ctx,
		func(ctx context.Context) (*page, error) {
			resp, err := events.ListEvents(ctx, req)
			if err != nil {
				return nil, err
			}
			return &page{ListEventsResponse: resp}, nil
		})
}

// page is a ListEvents answer with its events' viewFull messages, rendered
// once, by the first stream that replays it, for every stream sharing it
// (a connect storm replays one page to each of its connections).
type page struct {
	*taskrunnerv1.ListEventsResponse

	once   sync.Once
	frames [][]byte // read-only once rendered
	err    error
}

// frame is event i's viewFull message.
func (p *page) frame(i int) ([]byte, error) {
	p.once.Do(func() {
		p.frames = make([][]byte, len(p.GetEvents()))
		for j, e := range p.GetEvents() {
			if p.frames[j], p.err = encodeFrame(nil, e); p.err != nil {
				return
			}
		}
	})
	return p.frames[i], p.err
}
