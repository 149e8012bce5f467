package events

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/task"
)

// ReasonTaskFinished is the ErrorInfo reason of the FailedPrecondition that
// refuses a Hello for a finished task. Its metadata carries
// "last_persisted_seq", so a runner whose final event was stored but not
// acknowledged before the connection broke can tell that it is done.
const ReasonTaskFinished = "TASK_FINISHED"

// Server implements EventsService. Create it with New and stop it with Close.
type Server struct {
	taskrunnerv1.UnimplementedEventsServiceServer

	cfg    Config
	rdb    redis.UniversalClient
	log    *slog.Logger
	store  *Store
	tasks  *task.Store
	intake *intake // where runner streams leave their events for the committers
	commit []*committer

	ctx    context.Context // ends at Close: streams return Unavailable
	stop   context.CancelFunc
	wg     sync.WaitGroup
	closed sync.Once
	ready  chan struct{}

	mu   sync.Mutex
	live map[string]map[*runnerConn]struct{} // task id → its runner streams here
}

var _ taskrunnerv1.EventsServiceServer = (*Server)(nil)

// runnerConn is one runner stream held by this replica, for Cancel delivery.
type runnerConn struct {
	cancel chan string
}

// New validates cfg and starts the group committer, the Redis publisher and
// the replica's Cancel subscription (one PSUBSCRIBE for all streams). pool
// must hold the migrated schema; rdb is the shared Redis; logger must not be
// nil. Call Close before the gRPC server's GracefulStop so runner streams end
// (with Unavailable: runners reconnect to another replica).
func New(cfg Config, pool *pgxpool.Pool, rdb redis.UniversalClient, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pool == nil || rdb == nil || logger == nil {
		return nil, errors.New("events: New needs a pool, a redis client and a logger")
	}
	cfg = cfg.withDefaults()
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, rdb: rdb, log: logger, store: NewStore(pool), tasks: task.NewStore(pool),
		ctx: ctx, stop: stop, ready: make(chan struct{}),
		live: map[string]map[*runnerConn]struct{}{},
	}
	s.intake = newIntake(cfg.Committers, cfg.QueueSize, overflowAt(cfg))
	s.commit = newCommitters(cfg.Committers, cfg, pool, logger)
	var committing sync.WaitGroup
	for k, c := range s.commit {
		committing.Go(func() { c.run(ctx, s.intake, k) })
	}
	publish := s.commit[0].publish
	s.wg.Add(2)
	go func() { defer s.wg.Done(); committing.Wait(); close(publish) }()
	go func() { defer s.wg.Done(); runPublisher(task.NewRedisPublisher(rdb, cfg.RedisPrefix, logger), publish) }()
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.runCancels(ctx) }()
	return s, nil
}

// overflowAt is how many submissions must wait before committers beyond
// the first take work (see intake): a fifth of a full batch. Fewer, and a
// second transaction would only split batches the first committer keeps
// up with.
func overflowAt(cfg Config) int { return max(cfg.MaxBatch/5, 1) }

// Committers is the number of group committers this server runs.
func (s *Server) Committers() int { return len(s.commit) }

// Store returns the read side of task_events (for the gateway's replay).
func (s *Server) Store() *Store { return s.store }

// Ready is closed once this replica's Cancel subscription is active.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Close ends every stream with Unavailable, finishes the batch being
// committed and stops the background goroutines. It is idempotent.
func (s *Server) Close() {
	s.closed.Do(func() {
		s.stop()
		s.wg.Wait()
	})
}

// Cancel asks whichever replica holds the task's runner stream to push
// Cancel{reason} to the runner. It is fire-and-forget: a runner that is not
// connected at that moment does not get it (the task's status still says
// cancelled, and its next Hello is refused).
func (s *Server) Cancel(ctx context.Context, taskID, reason string) error {
	if _, err := uuid.Parse(taskID); err != nil {
		return errs.Invalid("task_id", "must be a task id")
	}
	if err := s.rdb.Publish(ctx, CancelChannel(s.cfg.RedisPrefix, taskID), reason).Err(); err != nil {
		return fmt.Errorf("events: publish cancel: %w", err)
	}
	return nil
}

// runCancels holds the replica's PSUBSCRIBE to every task's cancel channel
// and hands each message to the local streams of that task.
func (s *Server) runCancels(ctx context.Context) {
	ps := s.rdb.PSubscribe(ctx, cancelPattern(s.cfg.RedisPrefix))
	defer ps.Close()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 100*time.Millisecond, 5*time.Second
	if _, err := backoff.Retry(ctx, func() (any, error) { return ps.Receive(ctx) },
		backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, _ time.Duration) {
			s.log.Warn("events: cancel subscription not ready; retrying", "error", err)
		})); err != nil {
		return // ctx ended
	}
	close(s.ready)
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			id, ok := taskFromCancelChannel(s.cfg.RedisPrefix, m.Channel)
			if !ok {
				continue
			}
			s.mu.Lock()
			for c := range s.live[id] {
				select {
				case c.cancel <- m.Payload:
				default: // one pending cancel is enough
				}
			}
			s.mu.Unlock()
		}
	}
}

func (s *Server) register(taskID string) *runnerConn {
	c := &runnerConn{cancel: make(chan string, 1)}
	s.mu.Lock()
	if s.live[taskID] == nil {
		s.live[taskID] = map[*runnerConn]struct{}{}
	}
	s.live[taskID][c] = struct{}{}
	s.mu.Unlock()
	return c
}

func (s *Server) unregister(taskID string, c *runnerConn) {
	s.mu.Lock()
	delete(s.live[taskID], c)
	if len(s.live[taskID]) == 0 {
		delete(s.live, taskID)
	}
	s.mu.Unlock()
}

var errShuttingDown = status.Error(codes.Unavailable, "events server is shutting down; reconnect")

// Connect implements the runner protocol (see events.proto and package doc):
// check the certificate, wait for the Hello, accept it, welcome the runner,
// then relay acks and cancels until the stream ends.
func (s *Server) Connect(stream grpc.BidiStreamingServer[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse]) error {
	ctx := stream.Context()
	certTask, err := runnerIdentity(ctx, s.cfg.TrustDomain)
	if err != nil {
		return err
	}

	// One goroutine reads (readRunner); this goroutine decides, and is the
	// stream's only sender (Welcome, Acks, Cancel).
	rs := &runnerStream{
		stream:   stream,
		first:    make(chan *taskrunnerv1.ConnectRequest, 1),
		accepted: make(chan struct{}),
		recvErr:  make(chan error, 1),
		done:     make(chan struct{}),
		results:  newSink(),
	}
	defer close(rs.done)
	go s.readRunner(rs)

	hello, err := s.awaitHello(rs)
	if err != nil {
		return err
	}
	last, err := s.acceptHello(ctx, certTask, hello)
	if err != nil {
		return err
	}
	taskID := hello.GetTaskId()
	rs.taskID = taskID // before accepted is closed

	conn := s.register(taskID)
	defer s.unregister(taskID, conn)
	if err := stream.Send(&taskrunnerv1.ConnectResponse{Msg: &taskrunnerv1.ConnectResponse_Welcome{Welcome: &taskrunnerv1.Welcome{
		LastPersistedSeq: last, HeartbeatIntervalSeconds: int32(s.cfg.HeartbeatInterval / time.Second),
	}}}); err != nil {
		return err
	}
	s.log.InfoContext(ctx, "runner connected", "task_id", taskID, "runner_version", hello.GetRunnerVersion(), "last_persisted_seq", last)

	close(rs.accepted)
	return s.relay(ctx, rs, conn)
}

// runnerStream is what Connect and its reader goroutine share.
type runnerStream struct {
	stream    grpc.BidiStreamingServer[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse]
	first     chan *taskrunnerv1.ConnectRequest // the first message (the Hello)
	accepted  chan struct{}                     // closed once the Hello is accepted
	recvErr   chan error
	done      chan struct{} // closed when Connect returns
	taskID    string        // set before accepted is closed
	results   *sink
	submitted atomic.Int64 // highest seq handed to the committer
}

// runnerIdentity is the task of the runner's client certificate.
func runnerIdentity(ctx context.Context, trustDomain string) (string, error) {
	certTask, err := pki.TaskIDFromContext(ctx, trustDomain)
	if err != nil {
		if errors.Is(err, pki.ErrNoVerifiedCert) {
			return "", status.Error(codes.Unauthenticated, "Connect needs a runner client certificate issued by the runner CA")
		}
		return "", status.Error(codes.PermissionDenied, "the client certificate is not a task identity of this trust domain")
	}
	return certTask, nil
}

// readRunner is the stream's one reader: it hands the first message (the
// Hello) over and, once Connect has accepted it, turns every later message
// straight into committer work, one hand-off per event.
func (s *Server) readRunner(rs *runnerStream) {
	m, err := rs.stream.Recv()
	if err != nil {
		rs.recvErr <- err
		return
	}
	rs.first <- m
	select {
	case <-rs.accepted:
	case <-rs.done:
		return
	}
	ended := false // the runner sent its terminal event on this stream
	for {
		m, err := rs.stream.Recv()
		if err != nil {
			rs.recvErr <- err // io.EOF only after every submission is queued
			return
		}
		sub, err := s.submission(rs.taskID, m, rs.results)
		if err != nil {
			rs.recvErr <- err
			return
		}
		// Until its terminal event the runner is still working: the
		// Hello checked that none is stored, this tracks the stream.
		sub.late, ended = !ended, ended || sub.ev != nil && eventwire.RunnerTerminal(sub.ev)
		if !s.intake.enter(rs.done, s.ctx.Done()) {
			if s.ctx.Err() != nil {
				rs.recvErr <- errShuttingDown
			}
			return
		}
		s.intake.put(sub)
		if sub.ev != nil && sub.ev.GetSeq() > rs.submitted.Load() {
			rs.submitted.Store(sub.ev.GetSeq())
		}
	}
}

// awaitHello waits (at most HelloTimeout) for the first message, which must
// be a Hello.
func (s *Server) awaitHello(rs *runnerStream) (*taskrunnerv1.Hello, error) {
	helloTimer := time.NewTimer(s.cfg.HelloTimeout)
	defer helloTimer.Stop()
	select {
	case m := <-rs.first:
		hello := m.GetHello()
		if hello == nil {
			return nil, status.Error(codes.InvalidArgument, "the first message on Connect must be Hello")
		}
		return hello, nil
	case err := <-rs.recvErr:
		return nil, err
	case <-helloTimer.C:
		return nil, status.Error(codes.DeadlineExceeded, "no Hello received in time")
	case <-s.ctx.Done():
		return nil, errShuttingDown
	}
}

// acceptHello checks a Hello against the certificate, the protocol version
// and the task (live, or finished but still owed a late runner's events; of
// this run) and answers the last runner seq stored for the task.
func (s *Server) acceptHello(ctx context.Context, certTask string, hello *taskrunnerv1.Hello) (int64, error) {
	taskID := hello.GetTaskId()
	if taskID != certTask {
		return 0, status.Errorf(codes.PermissionDenied, "the client certificate is for task %s, but Hello names task %q", certTask, taskID)
	}
	if v := hello.GetProtocolVersion(); v != taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1 {
		return 0, status.Errorf(codes.FailedPrecondition, "runner protocol version %d not supported, server speaks %d: update the runner image", int32(v), ProtocolVersion)
	}
	if _, err := uuid.Parse(taskID); err != nil {
		return 0, status.Errorf(codes.FailedPrecondition, "task %q does not exist", taskID)
	}
	tk, err := s.tasks.Get(ctx, taskID, "")
	if errors.Is(err, errs.ErrNotFound) {
		return 0, status.Errorf(codes.FailedPrecondition, "task %s does not exist", taskID)
	}
	if err != nil {
		return 0, storeUnavailable(err)
	}
	last, err := s.tasks.LastRunnerSeq(ctx, taskID)
	if err != nil {
		return 0, storeUnavailable(err)
	}
	if tk.Status.Terminal() {
		// A late runner of a task the control plane failed may still
		// deliver its events and the pull request it salvaged
		// (task.AcceptsLateRunner), unless it already sent its own
		// terminal event.
		ended, err := s.store.RunnerEnded(ctx, taskID)
		if err != nil {
			return 0, storeUnavailable(err)
		}
		if ended || !task.AcceptsLateRunner(tk) {
			return 0, finished(taskID, string(tk.Status), last)
		}
	}
	if run := max(hello.GetRun(), 1); run != max(tk.Run, 1) {
		return 0, status.Errorf(codes.FailedPrecondition, "task %s is on run %d: the runner of run %d is done", taskID, tk.Run, run)
	}
	return last, nil
}

// relay sends the committer's acks and any Cancel for the task until the
// runner closes its side (then every submitted event is acked first), the
// committer refuses an event, or the stream or the server ends.
func (s *Server) relay(ctx context.Context, rs *runnerStream, conn *runnerConn) error {
	var sentAck int64
	eof := false
	for {
		if eof && sentAck >= rs.submitted.Load() {
			return nil
		}
		select {
		case err := <-rs.recvErr:
			if !errors.Is(err, io.EOF) {
				return err
			}
			eof = true // the runner is done sending: flush the acks, then end
		case <-rs.results.notify:
			ack, refused := rs.results.state()
			if ack > sentAck {
				if err := rs.stream.Send(&taskrunnerv1.ConnectResponse{Msg: &taskrunnerv1.ConnectResponse_Ack{Ack: &taskrunnerv1.Ack{Seq: ack}}}); err != nil {
					return err
				}
				sentAck = ack
			}
			if refused != nil {
				return refused
			}
		case reason := <-conn.cancel:
			if err := rs.stream.Send(&taskrunnerv1.ConnectResponse{Msg: &taskrunnerv1.ConnectResponse_Cancel{Cancel: &taskrunnerv1.Cancel{Reason: reason}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
			return errShuttingDown
		}
	}
}

// storeUnavailable answers a database failure while accepting a runner
// with Unavailable (and errs' retry delay), which runners retry, never
// Internal.
func storeUnavailable(err error) error {
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	return errs.Unavailable("the event store is unavailable; reconnect and resend")
}

// finished refuses a Hello for a terminal task, telling the runner how far
// its events were stored.
func finished(taskID, st string, last int64) error {
	sts := status.Newf(codes.FailedPrecondition, "task %s is %s: a finished task accepts no runner", taskID, st)
	if d, err := sts.WithDetails(&errdetails.ErrorInfo{Reason: ReasonTaskFinished, Domain: errs.Domain,
		Metadata: map[string]string{"last_persisted_seq": strconv.FormatInt(last, 10), "status": st}}); err == nil {
		sts = d
	}
	return sts.Err()
}

// submission validates one runner message and turns it into committer work.
func (s *Server) submission(taskID string, m *taskrunnerv1.ConnectRequest, results *sink) (*submission, error) {
	switch msg := m.GetMsg().(type) {
	case *taskrunnerv1.ConnectRequest_Heartbeat:
		return &submission{taskID: taskID, sink: results}, nil
	case *taskrunnerv1.ConnectRequest_Event:
		ev := msg.Event
		if ev.GetSeq() < 1 {
			return nil, errs.Invalid("event.seq", "must be 1 or more, got %d", ev.GetSeq())
		}
		typ := eventwire.TypeName(ev)
		switch typ {
		case "":
			return nil, errs.Invalid("event.payload", "event %d has no payload", ev.GetSeq())
		case eventwire.TypeStatusChange, eventwire.TypeQueuePosition, eventwire.TypeSandbox:
			return nil, errs.Invalid("event.payload", "event %d is a %s: only the control plane writes those", ev.GetSeq(), typ)
		}
		// Reasons end up in task rows and browsers: redact like the task row does.
		switch p := ev.GetPayload().(type) {
		case *taskrunnerv1.Event_Failed:
			p.Failed.Reason = task.CleanReason(p.Failed.GetReason())
		case *taskrunnerv1.Event_Cancelled:
			p.Cancelled.Reason = task.CleanReason(p.Cancelled.GetReason())
		}
		body, err := eventwire.EncodeBody(ev)
		if err != nil {
			return nil, errs.Invalid("event", "cannot encode event %d", ev.GetSeq())
		}
		if len(body) > s.cfg.MaxEventBytes {
			return nil, errs.Invalid("event", "event %d is %d bytes, more than the limit of %d", ev.GetSeq(), len(body), s.cfg.MaxEventBytes)
		}
		return &submission{taskID: taskID, ev: ev, typ: typ, body: body, sink: results}, nil
	case *taskrunnerv1.ConnectRequest_Hello:
		return nil, errs.Invalid("hello", "Hello is allowed only as the first message")
	}
	return nil, errs.Invalid("msg", "empty message")
}
