package sse

import (
	"bufio"
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
	stop        chan struct{} // ends maintain
	stopOnce    sync.Once
	maintained  sync.WaitGroup

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
	h.stop = make(chan struct{})
	h.maintained.Go(h.maintain)
	return h, nil
}

// maintain does for parked streams (which have no goroutine) what each
// stream's goroutine does for itself: heartbeats (a round every half
// Heartbeat; a parked stream that wrote nothing for a whole round is
// pinged) and status checks, one GetTask per token and task every
// StatusInterval.
func (h *Handler) maintain() {
	hb := time.NewTicker(h.cfg.Heartbeat / 2)
	defer hb.Stop()
	st := time.NewTicker(h.cfg.StatusInterval)
	defer st.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-hb.C:
			h.hub.heartbeat()
		case <-st.C:
			h.checkParked()
		}
	}
}

// checkParked gives the parked streams of a task that finished, is gone or
// whose token no longer reads it back to goroutines that end them.
func (h *Handler) checkParked() {
	for key, s := range h.hub.parkedStreams() {
		select {
		case <-h.stop:
			return
		default:
		}
		tk, err := h.look.task(s.ctx, h.tasks, key.token, key.task)
		switch status.Code(err) {
		case codes.OK:
			if !eventwire.TerminalStatus(tk.GetStatus()) {
				continue
			}
		case codes.NotFound, codes.Unauthenticated, codes.PermissionDenied:
		default:
			continue // the stream's own check logs transient failures
		}
		h.hub.recheck(key)
	}
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
func (h *Handler) Close() {
	h.stopOnce.Do(func() { close(h.stop) })
	h.maintained.Wait()
	h.hub.close()
}

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

	c := &stream{h: h, w: w, rc: http.NewResponseController(w), ctx: ctx, md: md, tok: tokHash, taskID: taskID,
		cursor: cursor{view: v, last: after, sent: after}}
	if after > 0 {
		// Resuming: the stage the task is in now is the best guess of the
		// stage at after (status_change frames carry it).
		c.seed.stage = shortStage(tk.GetStage())
	}
	if !finished {
		// Subscribe before the replay, so nothing committed in between is
		// missed; a finished task publishes nothing more.
		c.takeOver = canTakeOver(w, r)
		rc := c.rc
		c.watcher = newWatcher(c, func() { _ = rc.SetWriteDeadline(time.Now()) })
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
	} else {
		c.subscribed = time.Now() // the task is over: any page from now on is whole
	}
	h.subscribers.Add(1)
	if err := c.run(); !errors.Is(err, errParked) {
		c.end(err)
	}
	// Parked: the connection is the topic writer's now (see writer.go).
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

// errEnded: the hub dropped the stream (slow client, client gone or
// shutdown); the client may reconnect.
var errEnded = errors.New("sse: stream ended by the hub")

// errParked: the stream caught up and its topic's writer took it over; the
// goroutine that ran it must let go of it.
var errParked = errors.New("sse: stream parked")

// stream is one open SSE connection.
type stream struct {
	h      *Handler
	w      http.ResponseWriter
	rc     *http.ResponseController
	ctx    context.Context // carries the caller's token to the services
	md     metadata.MD     // the caller's token and request id, for ctx once the request is over
	tok    tokenHash
	taskID string
	cursor // the position in the timeline (the writer's while parked)

	watcher *watcher // nil for a task that had finished when it connected
	buf     []byte   // from bufPool while a burst is rendered, nil between

	// takeOver: the connection can be taken over (HTTP/1.x), and then the
	// stream parks whenever it catches up; conn is the taken-over
	// connection and bw its pooled write buffer while a burst is written.
	takeOver bool
	conn     *liveConn
	bw       *bufio.Writer

	// Set by the writer when it hands the stream back (resume): bytes it
	// could not write without blocking (then the end, if endAfterPending),
	// a status check to run first, or why the stream must end.
	pending         []byte
	endAfterPending bool
	checkNow        bool
	endErr          error

	subscribed time.Time // replay pages fetched after it may be shared (see lookups)
	seen       int64     // the highest seq the hub had seen when the stream joined
	deadline   time.Time // the connection's write deadline
	ended      atomic.Bool
}

// bufPool holds the buffers streams render frames into, bwPool the write
// buffers of taken-over connections: an idle stream holds neither.
var (
	bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}
	bwPool  = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}
)

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
// until the final one (or until it parks: errParked).
func (c *stream) run() error {
	hd := c.w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	if c.takeOver {
		// No chunking, and the connection closes at the end (conn.go).
		hd.Set("Transfer-Encoding", "identity")
	}
	c.w.WriteHeader(http.StatusOK)
	b := append(c.buffer(), "retry: "...)
	b = strconv.AppendInt(b, c.h.cfg.Retry.Milliseconds(), 10)
	b = append(b, "\n\n"...)
	// Sent with the replay's first page: one write for both.
	c.arm()
	if err := c.write(b); err != nil {
		return err
	}
	c.release()
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
	return c.follow()
}

// follow writes live events from the ring until the final one, parking
// the stream whenever it has caught up (errParked).
func (c *stream) follow() error {
	if c.checkNow {
		c.checkNow = false
		if ended, err := c.checkStatus(); ended || err != nil {
			return c.finish(err)
		}
	}
	heartbeat := time.NewTicker(c.h.cfg.Heartbeat)
	defer heartbeat.Stop()
	check := time.NewTicker(c.h.cfg.StatusInterval)
	defer check.Stop()
	var batch [64]*frame
	for {
		if err := c.park(); err != nil {
			return err
		}
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
			if err := c.flush(); err != nil {
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

// park takes the connection over (the first time) and hands the stream to
// its topic's writer if it has caught up: errParked. A connection that
// cannot be taken over keeps its goroutine.
func (c *stream) park() error {
	if !c.takeOver {
		return nil
	}
	if c.conn == nil {
		if err := c.flush(); err != nil {
			return err
		}
		lc, err := takeOver(c.rc)
		if err != nil {
			c.takeOver = false
			c.h.log.WarnContext(c.ctx, "sse: cannot take the connection over", "task_id", c.taskID, "error", err)
			return nil
		}
		c.conn = lc
		c.watcher.setCut(func() { _ = lc.setDeadline(time.Now()) })
		// net/http's response (and through it the request and the
		// connection's buffers) is not needed any more: let it go.
		c.w, c.rc = nil, nil
		c.deadline = time.Time{} // hijacking cleared it
		// The request is over for net/http: its context ends when this
		// handler returns, and nothing of it should be kept.
		c.ctx = metadata.NewOutgoingContext(context.Background(), c.md)
		if lc.raw == nil {
			c.takeOver = false // not a socket: writes stay on this goroutine
			return nil
		}
		if err := c.h.hub.mon.add(lc, func() { c.h.hub.gone(c.taskID, c.watcher) }); err != nil {
			c.h.log.WarnContext(c.ctx, "sse: cannot watch the connection for its close", "task_id", c.taskID, "error", err)
		}
	}
	c.release()
	if !c.deadline.IsZero() {
		// The writer's writes never block; a passed deadline would refuse them.
		if err := c.conn.setDeadline(time.Time{}); err != nil {
			return err
		}
		c.deadline = time.Time{}
	}
	if c.h.hub.park(c.watcher) {
		return errParked
	}
	return nil
}

// resume runs a stream the topic's writer handed back (see writer.go) on a
// goroutine until it parks again or ends.
func (c *stream) resume() {
	var err error
	if len(c.pending) > 0 {
		c.arm()
		_, err = c.conn.nc.Write(c.pending)
		c.pending = nil
		if err == nil && c.endAfterPending {
			c.end(nil)
			return
		}
	}
	if err == nil {
		c.watcher.signal() // read the ring now
		if err = c.follow(); errors.Is(err, errParked) {
			return
		}
	}
	c.end(err)
}

// end ends the stream once, whoever notices first: it leaves the hub,
// closes a taken-over connection and stops counting the stream.
func (c *stream) end(err error) {
	if !c.ended.CompareAndSwap(false, true) {
		return
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, errEnded) {
		c.h.log.InfoContext(c.ctx, "sse: stream ended early", "task_id", c.taskID, "last_seq", c.last, "error", err)
	}
	if c.watcher != nil {
		if c.conn == nil {
			c.watcher.finish()
		}
		c.h.hub.leave(c.taskID, c.watcher)
	}
	c.release()
	if c.conn != nil {
		if c.bw != nil {
			c.bw.Reset(nil)
			bwPool.Put(c.bw)
			c.bw = nil
		}
		c.h.hub.mon.remove(c.conn)
		_ = c.conn.nc.Close()
	} else {
		// net/http keeps a connection's deadline for its next request when
		// the server has no WriteTimeout of its own.
		_ = c.rc.SetWriteDeadline(time.Time{})
	}
	c.h.subscribers.Add(-1)
}

// finish ends a stream that reached its end (err == nil): it writes what
// the view still owes the client and flushes.
func (c *stream) finish(err error) error {
	if err != nil {
		return err
	}
	if c.view == viewSeed {
		c.buf = c.appendEnd(c.buffer())
		if len(c.buf) > 0 {
			if err := c.write(c.buf); err != nil {
				return err
			}
		}
	}
	return c.flush()
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
	c.buf, ended = c.appendSeed(c.buffer(), e)
	if len(c.buf) > 0 {
		if err := c.write(c.buf); err != nil {
			return false, err
		}
	}
	return ended, nil
}

// appendSeed renders e in the seed view and advances cur; ended is true
// after the final event.
func (cur *cursor) appendSeed(dst []byte, e *taskrunnerv1.Event) (out []byte, ended bool) {
	var wrote bool
	dst, wrote = cur.seed.append(dst, e)
	if wrote {
		cur.sent = e.GetSeq()
	}
	cur.last = e.GetSeq()
	return dst, eventwire.Final(e)
}

// appendEnd renders what the view owes a client whose stream ends here
// (the seed view's end; nothing for viewFull).
func (cur *cursor) appendEnd(dst []byte) []byte {
	if cur.view != viewSeed {
		return dst
	}
	n := len(dst)
	dst = cur.seed.end(dst, cur.last, cur.sent)
	if len(dst) > n {
		cur.sent = cur.last
	}
	return dst
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
		for i, e := range resp.GetEvents() {
			if follow.Next(c.last, e.GetSeq()) == follow.Skip {
				continue
			}
			if c.view == viewSeed {
				if ended, err = c.writeSeed(e); err != nil {
					return false, err
				}
			} else {
				b, err := resp.frame(i)
				if err != nil {
					return false, err
				}
				if err := c.write(b); err != nil {
					return false, err
				}
				c.last, c.sent = e.GetSeq(), e.GetSeq()
				ended = eventwire.Final(e)
			}
			if ended {
				return true, nil
			}
		}
		if err := c.flush(); err != nil {
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
	return c.flush()
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
	if c.conn != nil {
		_ = c.conn.setDeadline(c.deadline)
	} else {
		_ = c.rc.SetWriteDeadline(c.deadline)
	}
}

// write buffers b (a full buffer writes through) under the deadline of the
// last arm. A watcher the hub has dropped writes nothing more (its cut may
// already have passed, so the deadline must not let the write block long).
func (c *stream) write(b []byte) error {
	if c.watcher != nil && c.watcher.dropped.Load() {
		return errEnded
	}
	if c.conn != nil {
		if c.bw == nil {
			c.bw = bwPool.Get().(*bufio.Writer)
			c.bw.Reset(c.conn.nc)
		}
		_, err := c.bw.Write(b)
		return err
	}
	_, err := c.w.Write(b)
	return err
}

// flush sends what write buffered.
func (c *stream) flush() error {
	if c.conn == nil {
		return c.rc.Flush()
	}
	if c.bw == nil {
		return nil
	}
	err := c.bw.Flush()
	c.bw.Reset(nil)
	bwPool.Put(c.bw)
	c.bw = nil
	return err
}
