package sse

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	"github.com/taskrunner/taskrunner/platform/follow"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Route patterns (net/http ServeMux syntax), all served by Handler.
//
// PathPattern serves every event of the timeline (viewFull); the project
// paths serve the seed frontend's contract (viewSeed, see seedView): the
// seed frontend's own path and the older /v1 one, which serve the same.
//
// The project paths take the repository either as one URL-encoded segment
// (owner%2Fname) or as two segments (owner/name).
// The branch is always one segment: a branch with a slash must be encoded
// (feature%2Fx). The task must belong to that repository (compared without
// case, as GitHub does) and have that branch as its base or head branch,
// or the answer is 404.
const (
	PathPattern            = "GET /v1/tasks/{id}/events"
	SeedPathPattern        = "GET /projects/{repo}/branches/{branch}/tasks/{id}/events"
	SeedSplitPathPattern   = "GET /projects/{owner}/{name}/branches/{branch}/tasks/{id}/events"
	LegacyPathPattern      = "GET /v1/projects/{repo}/branches/{branch}/tasks/{id}/events"
	LegacySplitPathPattern = "GET /v1/projects/{owner}/{name}/branches/{branch}/tasks/{id}/events"
)

const (
	subscribeTimeout  = 10 * time.Second
	lastEventIDHeader = "Last-Event-ID"
	lastEventIDQuery  = "last_event_id"
	accessTokenQuery  = "access_token"
	requestIDHeader   = "X-Request-Id"
	bearerPrefix      = "Bearer "
	heartbeatComment  = ": ping\n\n"
	bearerChallenge   = `Bearer realm="taskrunner"`
)

// Handler serves the SSE routes. Create it with New, mount Routes, and
// call Close when the HTTP server shuts down (before waiting for
// connections: streams never go idle on their own).
type Handler struct {
	cfg    Config
	tasks  taskrunnerv1.TaskServiceClient
	events taskrunnerv1.EventsServiceClient
	log    *slog.Logger
	hub    *hub
	look   *lookups
	mux    *http.ServeMux

	subscribers atomic.Int64

	// beforeReplay, when set (tests only), runs after the subscription is
	// confirmed and before the replay starts.
	beforeReplay func(taskID string)
}

// New validates cfg and starts the hub on rdb (one pub/sub connection for
// the whole process). tasks and events are clients of the public services;
// every call carries the caller's own bearer token.
func New(cfg Config, tasks taskrunnerv1.TaskServiceClient, events taskrunnerv1.EventsServiceClient, rdb redis.UniversalClient, logger *slog.Logger) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if tasks == nil || events == nil || rdb == nil || logger == nil {
		return nil, errors.New("sse: New needs a TaskService client, an EventsService client, a redis client and a logger")
	}
	h := &Handler{cfg: cfg.withDefaults(), tasks: tasks, events: events, log: logger}
	h.mux = http.NewServeMux()
	h.mux.HandleFunc(PathPattern, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, viewFull) })
	for _, p := range []string{SeedPathPattern, SeedSplitPathPattern, LegacyPathPattern, LegacySplitPathPattern} {
		h.mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, viewSeed) })
	}
	h.hub = newHub(rdb, h.cfg.RedisPrefix, h.cfg.ClientQueue, logger)
	h.look = newLookups(h.cfg.AuthTTL, subscribeTimeout)
	return h, nil
}

// Routes maps each route pattern to h, for rest.Options.Extra.
func (h *Handler) Routes() map[string]http.Handler {
	return map[string]http.Handler{PathPattern: h, SeedPathPattern: h, SeedSplitPathPattern: h, LegacyPathPattern: h, LegacySplitPathPattern: h}
}

// ServeHTTP serves the SSE routes and answers 404 for anything else.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Subscribers is the number of streams currently open (a gauge for metrics).
func (h *Handler) Subscribers() int64 { return h.subscribers.Load() }

// Channels is the number of task channels the hub has subscribed in Redis.
func (h *Handler) Channels() int { return h.hub.channels() }

// Close ends every stream (clients reconnect with Last-Event-ID, to another
// gateway if this one is going away) and closes the Redis connection. It
// is idempotent. Wire it with http.Server.RegisterOnShutdown.
func (h *Handler) Close() { h.hub.close() }

// token returns the caller's bearer token: the Authorization header, or
// the access_token query parameter, which exists because a browser's
// EventSource cannot set headers. ok is false for a malformed header.
func token(r *http.Request) (tok string, ok bool) {
	if v := r.Header.Get("Authorization"); v != "" {
		if len(v) <= len(bearerPrefix) || !strings.EqualFold(v[:len(bearerPrefix)], bearerPrefix) {
			return "", false
		}
		return strings.TrimSpace(v[len(bearerPrefix):]), true
	}
	return r.URL.Query().Get(accessTokenQuery), true
}

// lastEventID is where the replay starts: the Last-Event-ID header (sent
// by EventSource when it reconnects) or the last_event_id query parameter.
func lastEventID(r *http.Request) (int64, error) {
	v := r.Header.Get(lastEventIDHeader)
	if v == "" {
		v = r.URL.Query().Get(lastEventIDQuery)
	}
	return parseLastEventID(v)
}

// writeError answers like the REST API: {code, message, details} with the
// HTTP status of the gRPC code.
func writeError(w http.ResponseWriter, st *status.Status) {
	b, _ := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(st.Proto())
	httpStatus := runtime.HTTPStatusFromCode(st.Code())
	if httpStatus == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", bearerChallenge)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(append(b, '\n'))
}

// rpcError turns a service error into the client's answer. Service errors
// are already safe to show; transport failures are not (they name internal
// addresses), so those are logged and replaced.
func (h *Handler) rpcError(ctx context.Context, w http.ResponseWriter, what string, err error) {
	st, ok := status.FromError(err)
	switch {
	case !ok, st.Code() == codes.Unavailable, st.Code() == codes.Unknown, st.Code() == codes.DeadlineExceeded:
		h.log.WarnContext(ctx, "sse: "+what+" failed", "error", err)
		st = status.New(codes.Unavailable, "the task service is unavailable; retry later")
	}
	writeError(w, st)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, v view) {
	taskID := r.PathValue("id")
	tok, ok := token(r)
	switch {
	case !ok:
		writeError(w, status.New(codes.Unauthenticated, `malformed authorization header: want "Bearer <token>"`))
		return
	case tok == "":
		writeError(w, status.New(codes.Unauthenticated, "missing bearer token (Authorization header or access_token parameter)"))
		return
	}
	after, err := lastEventID(r)
	if err != nil {
		writeError(w, status.New(codes.InvalidArgument, err.Error()))
		return
	}
	md := metadata.Pairs("authorization", bearerPrefix+tok)
	if id := r.Header.Get(requestIDHeader); id != "" {
		md.Set("x-request-id", id)
	}
	ctx := metadata.NewOutgoingContext(r.Context(), md)

	tokHash := hashToken(tok)
	tk, err := h.look.task(ctx, h.tasks, tokHash, taskID)
	if err == nil && after >= tk.GetTimelineSeq() {
		// The client is caught up with what we know, and whether that is
		// the end (204) or not must not rest on a kept answer.
		h.look.forget(tokHash, taskID)
		tk, err = h.look.task(ctx, h.tasks, tokHash, taskID)
	}
	if err != nil {
		h.rpcError(ctx, w, "GetTask", err)
		return
	}
	if !legacyMatches(r, tk) {
		writeError(w, status.New(codes.NotFound, "task "+taskID+" not found in that repository and branch"))
		return
	}
	finished := eventwire.TerminalStatus(tk.GetStatus())
	if finished && after >= tk.GetTimelineSeq() {
		// The client has it all (EventSource reconnects whenever a stream
		// closes, even cleanly): 204 is the one answer that makes it stop.
		w.WriteHeader(http.StatusNoContent)
		return
	}

	c := &stream{h: h, w: w, rc: http.NewResponseController(w), ctx: ctx, tok: tokHash, taskID: taskID, view: v, last: after, sent: after}
	if after > 0 {
		// Resuming: the stage the task is in now is the best guess of the
		// stage at after (status_change frames carry it).
		c.seed.stage = shortStage(tk.GetStage())
	}
	defer func() {
		if c.watcher != nil {
			c.watcher.finish()
		}
		// net/http keeps a connection's deadline for its next request when
		// the server has no WriteTimeout of its own.
		_ = c.rc.SetWriteDeadline(time.Time{})
	}()
	if !finished {
		// Subscribe before the replay, so nothing committed in between is
		// missed; a finished task publishes nothing more.
		c.watcher = newWatcher(func() { _ = c.rc.SetWriteDeadline(time.Now()) })
		jctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
		var j joined
		j, err = h.hub.join(jctx, taskID, c.watcher)
		cancel()
		c.subscribed, c.seen = j.readyAt, j.seen
		if err != nil {
			h.log.WarnContext(ctx, "sse: subscribe failed", "task_id", taskID, "error", err)
			writeError(w, status.New(codes.Unavailable, "live events are unavailable; retry later"))
			return
		}
		defer h.hub.leave(taskID, c.watcher)
	} else {
		c.subscribed = time.Now() // the task is over: any page from now on is whole
	}
	h.subscribers.Add(1)
	defer h.subscribers.Add(-1)

	if err := c.run(); err != nil && !errors.Is(err, context.Canceled) {
		h.log.InfoContext(ctx, "sse: stream ended early", "task_id", taskID, "last_seq", c.last, "error", err)
	}
}

// legacyMatches checks the legacy path's repository and branch against the
// task; the plain path has none and always matches.
func legacyMatches(r *http.Request, tk *taskrunnerv1.Task) bool {
	branch := r.PathValue("branch")
	if branch == "" {
		return true
	}
	repo := r.PathValue("repo")
	if repo == "" {
		repo = r.PathValue("owner") + "/" + r.PathValue("name")
	}
	return strings.EqualFold(repo, tk.GetRepo()) && (branch == tk.GetBaseBranch() || branch == tk.GetHeadBranch())
}

// errEnded: the hub dropped the stream (slow client or shutdown); the
// client may reconnect.
var errEnded = errors.New("sse: stream ended by the hub")

// stream is one open SSE connection.
type stream struct {
	h       *Handler
	w       http.ResponseWriter
	rc      *http.ResponseController
	ctx     context.Context // carries the caller's token to the services
	tok     tokenHash
	taskID  string
	view    view
	seed    seedView
	last    int64    // highest seq processed; only strictly greater ones follow
	sent    int64    // highest seq written as an id (viewFull: always last)
	watcher *watcher // nil for a task that had finished when it connected
	buf     []byte   // from bufPool while a burst is written, nil between

	subscribed time.Time // replay pages fetched after it may be shared (see lookups)
	seen       int64     // the highest seq the hub had seen when the stream joined
	deadline   time.Time // the connection's write deadline
}

// bufPool holds the buffers streams render frames into: an idle stream
// holds none.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// buffer returns the stream's render buffer, emptied, from the pool.
func (c *stream) buffer() []byte {
	if c.buf == nil {
		c.buf = (*bufPool.Get().(*[]byte))[:0]
	}
	return c.buf[:0]
}

// release gives the render buffer back (large ones are left to the GC).
func (c *stream) release() {
	if c.buf != nil && cap(c.buf) <= 64<<10 {
		b := c.buf[:0]
		bufPool.Put(&b)
	}
	c.buf = nil
}

// run writes the stream: headers, replay after c.last, then, for a task
// that had not finished when the connection was authorised, live events
// until the final one.
func (c *stream) run() error {
	hd := c.w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	c.w.WriteHeader(http.StatusOK)
	defer c.release()
	b := append(c.buffer(), "retry: "...)
	b = strconv.AppendInt(b, c.h.cfg.Retry.Milliseconds(), 10)
	b = append(b, "\n\n"...)
	if err := c.send(b); err != nil {
		return err
	}
	if c.h.beforeReplay != nil {
		c.h.beforeReplay(c.taskID)
	}
	if ended, err := c.replay(); ended || err != nil {
		return c.finish(err)
	}
	if c.last < c.seen {
		// A shared page predates events the hub saw before this stream
		// joined (so they will not come live): read them on a page of
		// our own.
		c.subscribed = time.Now()
		if ended, err := c.replay(); ended || err != nil {
			return c.finish(err)
		}
	}
	if c.watcher == nil {
		// Finished before it connected, and its timeline has no final event
		// (written before status_change existed): the replay was all of it.
		return c.finish(nil)
	}

	heartbeat := time.NewTicker(c.h.cfg.Heartbeat)
	defer heartbeat.Stop()
	check := time.NewTicker(c.h.cfg.StatusInterval)
	defer check.Stop()
	var batch [64]*frame
	for {
		select {
		case <-c.watcher.wake:
			frames, resync, dropped := c.h.hub.read(c.watcher, batch[:0])
			if dropped != "" {
				return errors.Join(errEnded, errors.New(dropped))
			}
			if resync {
				c.subscribed = time.Now() // see hub.confirmed
				if ended, err := c.replay(); ended || err != nil {
					return c.finish(err)
				}
			}
			if len(frames) == 0 {
				continue
			}
			// Write every frame read, then flush once: under load this
			// turns many small writes into one syscall per batch.
			c.arm()
			for _, f := range frames {
				ended, err := c.live(f)
				if ended || err != nil {
					return c.finish(err)
				}
			}
			clear(batch[:len(frames)])
			if err := c.rc.Flush(); err != nil {
				return err
			}
			c.release()
		case <-heartbeat.C:
			if err := c.send([]byte(heartbeatComment)); err != nil {
				return err
			}
		case <-check.C:
			if ended, err := c.checkStatus(); ended || err != nil {
				return c.finish(err)
			}
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
}

// finish ends a stream that reached its end (err == nil): it writes what
// the view still owes the client and flushes.
func (c *stream) finish(err error) error {
	if err != nil {
		return err
	}
	if c.view == viewSeed {
		c.buf = c.seed.end(c.buffer(), c.last, c.sent)
		if len(c.buf) > 0 {
			if err := c.write(c.buf); err != nil {
				return err
			}
			c.sent = c.last
		}
	}
	return c.rc.Flush()
}

// live writes one live frame (without flushing); ended is true after the
// final event.
func (c *stream) live(f *frame) (ended bool, err error) {
	switch follow.Next(c.last, f.seq) {
	case follow.Skip:
		return false, nil // replayed already
	case follow.Fill:
		// Something between is missing here (published while we replayed,
		// by another writer of the timeline whose message comes later, or
		// lost by a reconnect): the log has it all, since nothing is
		// published before it is committed.
		if ended, err := c.replay(); ended || err != nil {
			return ended, err
		}
		if follow.AfterFill(c.last, f.seq) == follow.Skip {
			return false, nil
		}
		c.h.log.WarnContext(c.ctx, "sse: events missing from the log", "task_id", c.taskID, "after", c.last, "seq", f.seq)
	}
	if c.view == viewFull {
		if err := c.write(f.data); err != nil {
			return false, err
		}
		c.last, c.sent = f.seq, f.seq
		return f.final, nil
	}
	e, err := f.event()
	if err != nil {
		return false, err
	}
	return c.writeSeed(e)
}

// writeSeed writes e in the seed view; ended is true after the final event.
func (c *stream) writeSeed(e *taskrunnerv1.Event) (ended bool, err error) {
	var wrote bool
	c.buf, wrote = c.seed.append(c.buffer(), e)
	if wrote {
		if err := c.write(c.buf); err != nil {
			return false, err
		}
		c.sent = e.GetSeq()
	}
	c.last = e.GetSeq()
	return eventwire.Final(e), nil
}

// checkStatus is the safety net of a task that finished without a final
// event on its timeline (one written before status_change existed, or by
// an older control plane during an upgrade); it also ends the stream of a
// revoked token or a task that is gone. A finished task's stream ends
// after whatever the log still holds.
func (c *stream) checkStatus() (bool, error) {
	tk, err := c.h.look.task(c.ctx, c.h.tasks, c.tok, c.taskID)
	if err != nil {
		switch status.Code(err) {
		case codes.NotFound, codes.Unauthenticated, codes.PermissionDenied:
			return true, err // the task or the token is gone
		}
		c.h.log.WarnContext(c.ctx, "sse: status check failed", "task_id", c.taskID, "error", err)
		return false, nil
	}
	if !eventwire.TerminalStatus(tk.GetStatus()) {
		return false, nil
	}
	if _, err := c.replay(); err != nil {
		return true, err
	}
	return true, nil
}

// replay writes every stored event after c.last, page by page; ended is
// true once the final event is written.
func (c *stream) replay() (ended bool, err error) {
	for {
		resp, err := c.h.look.page(c.ctx, c.h.events, c.tok, &taskrunnerv1.ListEventsRequest{
			TaskId: c.taskID, AfterSeq: c.last, PageSize: int32(c.h.cfg.ReplayPageSize),
		}, c.subscribed)
		if err != nil {
			return false, err
		}
		// One write deadline and one flush per page.
		c.arm()
		for _, e := range resp.GetEvents() {
			if follow.Next(c.last, e.GetSeq()) == follow.Skip {
				continue
			}
			if c.view == viewSeed {
				if ended, err = c.writeSeed(e); err != nil {
					return false, err
				}
			} else {
				if c.buf, err = encodeFrame(c.buffer(), e); err != nil {
					return false, err
				}
				if err := c.write(c.buf); err != nil {
					return false, err
				}
				c.last, c.sent = e.GetSeq(), e.GetSeq()
				ended = eventwire.Final(e)
			}
			if ended {
				return true, nil
			}
		}
		if err := c.rc.Flush(); err != nil {
			return false, err
		}
		c.release()
		if resp.GetNextPageToken() == "" || len(resp.GetEvents()) == 0 {
			return false, nil
		}
	}
}

// send writes b and flushes it within the write timeout.
func (c *stream) send(b []byte) error {
	c.arm()
	if err := c.write(b); err != nil {
		return err
	}
	return c.rc.Flush()
}

// arm gives the writes and the flush that follow, together, at least half
// the write timeout (and at most all of it): a client that cannot take them
// in that time is cut off. The deadline is moved only once half of it is
// used up, not for every burst: a busy stream resets it a few times per
// WriteTimeout instead of once per batch of frames.
func (c *stream) arm() {
	now := time.Now()
	if c.deadline.Sub(now) >= c.h.cfg.WriteTimeout/2 {
		return
	}
	c.deadline = now.Add(c.h.cfg.WriteTimeout)
	_ = c.rc.SetWriteDeadline(c.deadline)
}

// write buffers b (a full buffer writes through) under the deadline of the
// last arm. A watcher the hub has dropped writes nothing more (its cut may
// already have passed, so the deadline must not let the write block long).
func (c *stream) write(b []byte) error {
	if c.watcher != nil && c.watcher.dropped.Load() {
		return errEnded
	}
	_, err := c.w.Write(b)
	return err
}
