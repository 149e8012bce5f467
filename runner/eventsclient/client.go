package eventsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Defaults.
const (
	DefaultBufferSize        = 10000
	DefaultMinBackoff        = 100 * time.Millisecond
	DefaultMaxBackoff        = 10 * time.Second
	DefaultHeartbeatInterval = 10 * time.Second
)

// reasonTaskFinished mirrors the server's ErrorInfo reason for a Hello on a
// finished task (services/events.ReasonTaskFinished).
const reasonTaskFinished = "TASK_FINISHED"

var (
	// ErrBufferFull is returned by Send for a log, diff_stats or usage event
	// while BufferSize events are unacknowledged.
	ErrBufferFull = errors.New("eventsclient: buffer of unacknowledged events is full")
	// ErrClosed is returned by Send after Close.
	ErrClosed = errors.New("eventsclient: closed")
)

// StreamWindow is the fixed HTTP/2 flow-control window of the connection,
// the same as the server's (events.StreamWindow in services/events, which
// explains the choice): a fixed window turns off grpc-go's bandwidth
// estimator, whose PINGs would otherwise double the frames of a sparse
// stream of small events and acks.
const StreamWindow = 1 << 20

// Config configures a Client.
type Config struct {
	// Addr is the Events service address (host:port).
	Addr string
	// TLS carries the task's client certificate and the CA that verifies the
	// server. Required unless Insecure.
	TLS *tls.Config
	// Insecure dials without TLS. For in-process tests only: a real server
	// refuses a runner without a client certificate.
	Insecure bool
	// TaskID is this runner's task; it must match the certificate.
	TaskID string
	// RunnerVersion is reported in Hello for the server's logs.
	RunnerVersion string
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
	// BufferSize bounds unacknowledged events (see package doc).
	BufferSize int
	// MinBackoff and MaxBackoff bound the reconnect delay, which doubles
	// after every failed attempt and is jittered.
	MinBackoff, MaxBackoff time.Duration
	// HeartbeatInterval overrides the interval the server asks for in Welcome.
	HeartbeatInterval time.Duration
	// DialOptions are appended to the client's own (tests use a custom dialer).
	DialOptions []grpc.DialOption
}

// Client streams a task's events to the Events service. Its methods are
// safe for concurrent use.
type Client struct {
	cfg  Config
	log  *slog.Logger
	conn *grpc.ClientConn
	rpc  taskrunnerv1.EventsServiceClient

	mu       sync.Mutex
	buf      []*taskrunnerv1.Event // unacknowledged, consecutive seqs
	lastSeq  int64                 // highest seq assigned
	acked    int64                 // highest seq acknowledged
	progress chan struct{}         // closed and replaced on every ack
	closing  bool
	fatal    error
	started  bool

	wake      chan struct{} // a new event for the sender
	closeSend chan struct{} // closed once Close has flushed everything
	closeOnce sync.Once
	cancelled chan string
	connected chan struct{} // closed at the first Welcome
	connOnce  sync.Once
	done      chan struct{}
	stop      context.CancelFunc
}

// New checks cfg and prepares a client; Start connects.
func New(cfg Config) (*Client, error) {
	if cfg.Addr == "" || cfg.TaskID == "" {
		return nil, errors.New("eventsclient: Addr and TaskID are required")
	}
	if cfg.TLS == nil && !cfg.Insecure {
		return nil, errors.New("eventsclient: TLS (the task's client certificate) is required")
	}
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = DefaultBufferSize
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithInitialWindowSize(StreamWindow), grpc.WithInitialConnWindowSize(StreamWindow)}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("eventsclient: %w", err)
	}
	return &Client{
		cfg: cfg, log: cfg.Logger.With("task_id", cfg.TaskID), conn: conn,
		rpc:       taskrunnerv1.NewEventsServiceClient(conn),
		progress:  make(chan struct{}),
		wake:      make(chan struct{}, 1),
		closeSend: make(chan struct{}),
		cancelled: make(chan string, 1),
		connected: make(chan struct{}),
		done:      make(chan struct{}),
	}, nil
}

// Start runs the connection loop in the background until ctx ends, Close
// finishes or a fatal error occurs. Call it once.
func (c *Client) Start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return
	}
	c.started = true
	ctx, c.stop = context.WithCancel(ctx)
	go c.loop(ctx)
}

// Send numbers ev (its Seq is overwritten; a nil Time becomes now), buffers
// a copy and returns the seq. It never blocks on the network.
func (c *Client) Send(ev *taskrunnerv1.Event) (int64, error) {
	if ev.GetPayload() == nil {
		return 0, errors.New("eventsclient: event without payload")
	}
	c.mu.Lock()
	switch {
	case c.fatal != nil:
		c.mu.Unlock()
		return 0, c.fatal
	case c.closing:
		c.mu.Unlock()
		return 0, ErrClosed
	case len(c.buf) >= c.cfg.BufferSize && droppable(ev):
		c.mu.Unlock()
		return 0, ErrBufferFull
	}
	e := proto.Clone(ev).(*taskrunnerv1.Event)
	c.lastSeq++
	e.Seq = c.lastSeq
	if e.Time == nil {
		e.Time = timestamppb.Now()
	}
	c.buf = append(c.buf, e)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return e.Seq, nil
}

// droppable events may be refused when the buffer is full.
func droppable(ev *taskrunnerv1.Event) bool {
	switch ev.GetPayload().(type) {
	case *taskrunnerv1.Event_Log, *taskrunnerv1.Event_DiffStats, *taskrunnerv1.Event_Usage:
		return true
	}
	return false
}

// Cancelled delivers the reason of a server-pushed Cancel.
func (c *Client) Cancelled() <-chan string { return c.cancelled }

// Connected is closed once the server has welcomed the first stream: from
// then on, events travel without waiting for a handshake (until a
// reconnect). Sending before it is fine; the events wait in the buffer.
func (c *Client) Connected() <-chan struct{} { return c.connected }

// Done is closed when the background loop has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is the fatal error that ended the loop, if any.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fatal
}

// Acked is the highest seq the server acknowledged.
func (c *Client) Acked() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acked
}

// Pending is the number of unacknowledged events.
func (c *Client) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buf)
}

// Close stops accepting events, waits until every sent event is
// acknowledged (or ctx ends, or the loop fails), ends the stream and frees
// the connection. It returns nil when everything was acknowledged.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closing = true
	started := c.started
	c.mu.Unlock()
	var err error
	if started {
		err = c.flush(ctx)
		c.closeOnce.Do(func() { close(c.closeSend) })
		select {
		case <-c.done:
		case <-ctx.Done():
		}
		c.stop()
		<-c.done
	}
	_ = c.conn.Close()
	if !started && c.Pending() > 0 {
		err = fmt.Errorf("eventsclient: closed before Start with %d events unsent", c.Pending())
	}
	return err
}

func (c *Client) flush(ctx context.Context) error {
	for {
		c.mu.Lock()
		drained, fatal, progress := c.acked >= c.lastSeq, c.fatal, c.progress
		c.mu.Unlock()
		switch {
		case drained:
			return nil
		case fatal != nil:
			return fatal
		}
		select {
		case <-progress:
		case <-c.done:
			c.mu.Lock()
			drained, fatal = c.acked >= c.lastSeq, c.fatal
			c.mu.Unlock()
			if drained {
				return nil
			}
			if fatal == nil {
				fatal = errors.New("eventsclient: stopped before every event was acknowledged")
			}
			return fatal
		case <-ctx.Done():
			return fmt.Errorf("eventsclient: %d events not acknowledged: %w", c.Pending(), ctx.Err())
		}
	}
}

// ackUpTo trims everything up to seq from the buffer.
func (c *Client) ackUpTo(seq int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq <= c.acked {
		return
	}
	if seq > c.lastSeq {
		// The server holds events this process never numbered (a restarted
		// runner): continue after them rather than reuse their seqs.
		c.log.Warn("server has more events than this runner sent; continuing after them", "server_seq", seq, "local_seq", c.lastSeq)
		c.lastSeq = seq
	}
	n := 0
	for n < len(c.buf) && c.buf[n].GetSeq() <= seq {
		n++
	}
	c.buf = append(c.buf[:0:0], c.buf[n:]...)
	c.acked = seq
	close(c.progress)
	c.progress = make(chan struct{})
}

func (c *Client) drained() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing && c.acked >= c.lastSeq
}

// pending returns the buffered events with seq >= from.
func (c *Client) pending(from int64) []*taskrunnerv1.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.buf) == 0 {
		return nil
	}
	i := max(from-c.buf[0].GetSeq(), 0)
	if i >= int64(len(c.buf)) {
		return nil
	}
	return append([]*taskrunnerv1.Event(nil), c.buf[i:]...)
}

// Retryable reports whether a stream error is worth a reconnect.
func Retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

func (c *Client) loop(ctx context.Context) {
	defer close(c.done)
	backoff := c.cfg.MinBackoff
	for {
		welcomed, err := c.session(ctx)
		switch {
		case ctx.Err() != nil, c.drained():
			return
		case c.finished(err):
			return
		case !Retryable(err):
			c.log.Error("events stream failed", "error", err)
			c.mu.Lock()
			c.fatal = err
			close(c.progress)
			c.progress = make(chan struct{})
			c.mu.Unlock()
			return
		}
		if welcomed {
			backoff = c.cfg.MinBackoff
		}
		delay := backoff/2 + rand.N(backoff/2+1)
		c.log.Warn("events stream interrupted; reconnecting", "error", err, "delay", delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-c.closeSend: // Close has flushed or given up
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, c.cfg.MaxBackoff)
	}
}

// finished handles the refusal of a Hello for a finished task: when the
// server already holds every event, the runner is done, not broken.
func (c *Client) finished(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return false
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetReason() != reasonTaskFinished {
			continue
		}
		last, perr := strconv.ParseInt(info.GetMetadata()["last_persisted_seq"], 10, 64)
		c.mu.Lock()
		all := perr == nil && last >= c.lastSeq
		c.mu.Unlock()
		if !all {
			return false
		}
		c.ackUpTo(last)
		c.mu.Lock()
		c.fatal = err // nothing more can be sent; Close still returns nil
		c.mu.Unlock()
		return true
	}
	return false
}

// session runs one stream: Hello, Welcome, then events out and acks in.
func (c *Client) session(ctx context.Context) (welcomed bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Connect(sctx)
	if err != nil {
		return false, err
	}
	if err := stream.Send(&taskrunnerv1.ConnectRequest{Msg: &taskrunnerv1.ConnectRequest_Hello{Hello: &taskrunnerv1.Hello{
		TaskId: c.cfg.TaskID, ProtocolVersion: taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1, RunnerVersion: c.cfg.RunnerVersion,
	}}}); err != nil {
		_, err = stream.Recv() // the real status
		return false, err
	}
	m, err := stream.Recv()
	if err != nil {
		return false, err
	}
	w := m.GetWelcome()
	if w == nil {
		return false, status.Error(codes.Internal, "eventsclient: server did not answer Hello with Welcome")
	}
	c.ackUpTo(w.GetLastPersistedSeq())
	c.connOnce.Do(func() { close(c.connected) })
	interval := c.cfg.HeartbeatInterval
	if interval <= 0 {
		interval = time.Duration(w.GetHeartbeatIntervalSeconds()) * time.Second
	}
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	c.log.Info("events stream connected", "last_persisted_seq", w.GetLastPersistedSeq())

	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		c.send(sctx, stream, w.GetLastPersistedSeq()+1, interval)
	}()
	defer func() { cancel(); <-senderDone }()
	for {
		m, err := stream.Recv()
		if err != nil {
			return true, err
		}
		switch msg := m.GetMsg().(type) {
		case *taskrunnerv1.ConnectResponse_Ack:
			c.ackUpTo(msg.Ack.GetSeq())
		case *taskrunnerv1.ConnectResponse_Cancel:
			c.log.Info("server asked to cancel", "reason", msg.Cancel.GetReason())
			select {
			case c.cancelled <- msg.Cancel.GetReason():
			default:
			}
		}
	}
}

// send writes buffered events from seq next on, and heartbeats, until the
// stream fails (the receiver then sees why) or Close has flushed.
func (c *Client) send(ctx context.Context, stream grpc.BidiStreamingClient[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse], next int64, interval time.Duration) {
	beat := time.NewTicker(interval)
	defer beat.Stop()
	closeSend := c.closeSend
	for {
		for _, e := range c.pending(next) {
			if err := stream.Send(&taskrunnerv1.ConnectRequest{Msg: &taskrunnerv1.ConnectRequest_Event{Event: e}}); err != nil {
				return
			}
			next = e.GetSeq() + 1
		}
		select {
		case <-c.wake:
		case <-beat.C:
			if err := stream.Send(&taskrunnerv1.ConnectRequest{Msg: &taskrunnerv1.ConnectRequest_Heartbeat{Heartbeat: &taskrunnerv1.Heartbeat{Time: timestamppb.Now()}}}); err != nil {
				return
			}
		case <-closeSend:
			closeSend = nil
			if c.drained() {
				_ = stream.CloseSend()
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
