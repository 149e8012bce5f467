package eventsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/rpcretry"
)

// Defaults.
const (
	DefaultBufferSize = 10000
	// DefaultBufferBytes bounds the in-memory buffer when events spill to disk beyond it.
	DefaultBufferBytes = 8 << 20
	DefaultMinBackoff  = rpcretry.DefaultMinDelay
	// DefaultMaxBackoff caps every reconnect delay, jitter included: a runner must be back
	// within about a second of the service, whatever the outage cost.
	DefaultMaxBackoff        = rpcretry.DefaultMaxDelay
	DefaultHeartbeatInterval = 10 * time.Second
)

// stableSession is how long a welcomed stream must live (or get an Ack) for the next
// reconnect to start again from MinBackoff: a server that welcomes and then fails at once
// (its database is down) must not be hammered at the shortest delay.
const stableSession = 5 * time.Second

// waitingLog is how long a connection attempt may wait for the service before it is logged.
const waitingLog = 5 * time.Second

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
	// Run is the task's run this runner works on (0 means 1); sent in Hello.
	Run int32
	// RunnerVersion is reported in Hello for the server's logs.
	RunnerVersion string
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
	// BufferSize bounds unacknowledged events kept in memory (see package doc).
	BufferSize int
	// SpillDir, when set, is where events beyond the in-memory buffer go (a file created on
	// first use, 0600, removed by Close): nothing is refused and memory stays bounded. Empty:
	// no spill, and Send refuses droppable events while the buffer is full.
	SpillDir string
	// BufferBytes bounds the in-memory buffer's size when SpillDir is set (default 8 MiB).
	BufferBytes int
	// MaxEventBytes is the server's limit on one event's JSON form (default MaxEventBytes).
	MaxEventBytes int
	// MinBackoff and MaxBackoff bound the reconnect delay: it starts near MinBackoff,
	// doubles after every failed attempt, is jittered, and never exceeds MaxBackoff
	// (defaults 100 ms and 1 s). grpc-go's own reconnect backoff gets the same bounds.
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
	buf      []*taskrunnerv1.Event // unacknowledged, consecutive seqs, oldest first
	bufBytes int                   // proto size of buf (kept only with a SpillDir: sizeOf)
	spill    *spill                // the events after buf, when buf is full
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

	// Owned by the loop goroutine (and the sender it runs, one at a time): the heartbeat
	// ticker lives across reconnects so heartbeats keep their cadence; a tick that falls
	// in an outage waits in the ticker's channel and goes out right after the next Welcome.
	beat      *time.Ticker
	beatEvery time.Duration
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
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = cfg.MinBackoff
	}
	if cfg.BufferBytes <= 0 {
		cfg.BufferBytes = DefaultBufferBytes
	}
	if cfg.MaxEventBytes <= 0 {
		cfg.MaxEventBytes = MaxEventBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithInitialWindowSize(StreamWindow), grpc.WithInitialConnWindowSize(StreamWindow),
		rpcretry.DialOption(cfg.MinBackoff, cfg.MaxBackoff)}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("eventsclient: %w", err)
	}
	return &Client{
		cfg: cfg, log: cfg.Logger.With("task_id", cfg.TaskID), conn: conn,
		rpc:       taskrunnerv1.NewEventsServiceClient(conn),
		spill:     &spill{dir: cfg.SpillDir},
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
// a copy and returns the seq. It never blocks on the network. An event the
// server would refuse as too big is made to fit: a log event is split into
// several (Send returns the last seq), any other event has its long strings
// cut; invalid UTF-8 becomes U+FFFD.
func (c *Client) Send(ev *taskrunnerv1.Event) (int64, error) {
	if ev.GetPayload() == nil {
		return 0, errors.New("eventsclient: event without payload")
	}
	evs, err := fitEvent(ev, c.cfg.MaxEventBytes)
	if err != nil {
		c.log.Error("event not sent", "error", err)
		return 0, err
	}
	c.mu.Lock()
	switch {
	case c.fatal != nil:
		c.mu.Unlock()
		return 0, c.fatal
	case c.closing:
		c.mu.Unlock()
		return 0, ErrClosed
	case c.fullLocked() && !c.spill.usable() && droppable(ev):
		c.mu.Unlock()
		return 0, ErrBufferFull
	}
	for _, e := range evs {
		c.lastSeq++
		e.Seq = c.lastSeq
		c.pushLocked(e)
	}
	seq := c.lastSeq
	c.mu.Unlock()
	c.wakeSender()
	return seq, nil
}

func (c *Client) wakeSender() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// sizeOf is e's share of bufBytes: its proto size when a spill file may take
// the events beyond BufferBytes, 0 otherwise (nothing else reads bufBytes,
// and sizing every event twice is a visible cost at thousands a second).
func (c *Client) sizeOf(e *taskrunnerv1.Event) int {
	if c.cfg.SpillDir == "" {
		return 0
	}
	return proto.Size(e)
}

// fullLocked reports whether the in-memory buffer is at its bound. Without a spill file only
// the count bounds it, as it always has.
func (c *Client) fullLocked() bool {
	if len(c.buf) >= c.cfg.BufferSize {
		return true
	}
	return c.spill.usable() && c.bufBytes >= c.cfg.BufferBytes
}

// pushLocked appends a numbered event: to memory while there is room and nothing waits on
// disk (the disk holds the newest events, after those in memory), to the spill file
// otherwise. When the file fails, what it holds comes back to memory and the client goes on
// without it.
func (c *Client) pushLocked(e *taskrunnerv1.Event) {
	if c.spill.usable() && (c.spill.len() > 0 || c.fullLocked()) {
		err := c.spill.push(e)
		if err == nil {
			return
		}
		c.log.Error("cannot spill events to disk; keeping them in memory", "error", err)
		c.unspillLocked()
	}
	c.buf = append(c.buf, e)
	c.bufBytes += c.sizeOf(e)
}

// unspillLocked moves every spilled event back to memory and gives up the file.
func (c *Client) unspillLocked() {
	for c.spill.len() > 0 {
		e, err := c.spill.pop()
		if err != nil {
			c.failLocked(fmt.Errorf("eventsclient: events %d.. were spilled to disk and cannot be read back: %w", c.lastSeqInMemLocked()+1, err))
			break
		}
		c.buf = append(c.buf, e)
		c.bufBytes += c.sizeOf(e)
	}
	if err := c.spill.remove(); err != nil {
		c.log.Warn("cannot remove the spill file", "error", err)
	}
}

// refillLocked moves spilled events to memory while there is room.
func (c *Client) refillLocked() (moved bool) {
	for c.spill.len() > 0 && !c.fullLocked() {
		e, err := c.spill.pop()
		if err != nil {
			c.failLocked(fmt.Errorf("eventsclient: events %d.. were spilled to disk and cannot be read back: %w", c.lastSeqInMemLocked()+1, err))
			return moved
		}
		if e.GetSeq() <= c.acked {
			continue
		}
		c.buf = append(c.buf, e)
		c.bufBytes += c.sizeOf(e)
		moved = true
	}
	return moved
}

func (c *Client) lastSeqInMemLocked() int64 {
	if len(c.buf) == 0 {
		return c.acked
	}
	return c.buf[len(c.buf)-1].GetSeq()
}

// failLocked records a fatal error and wakes whoever waits for progress.
func (c *Client) failLocked(err error) {
	if c.fatal == nil {
		c.fatal = err
	}
	close(c.progress)
	c.progress = make(chan struct{})
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

// Pending is the number of unacknowledged events, in memory and on disk.
func (c *Client) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buf) + c.spill.len()
}

// Spilled is the number of events waiting in the spill file.
func (c *Client) Spilled() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spill.len()
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
	c.mu.Lock()
	if rerr := c.spill.remove(); rerr != nil {
		c.log.Warn("cannot remove the spill file", "error", rerr)
	}
	c.mu.Unlock()
	return err
}

// WaitAcked waits until the server has acknowledged every event up to seq
// (they are stored), and returns nil then; or the client's fatal error, an
// error when it stops first, or ctx's. It wakes on each acknowledgement,
// not on a timer.
func (c *Client) WaitAcked(ctx context.Context, seq int64) error {
	return c.waitAcked(ctx, func() int64 { return seq })
}

// flush waits until every event sent so far is acknowledged.
func (c *Client) flush(ctx context.Context) error {
	return c.waitAcked(ctx, func() int64 { return c.lastSeq })
}

// waitAcked waits until everything up to target() (read under mu) is
// acknowledged.
func (c *Client) waitAcked(ctx context.Context, target func() int64) error {
	for {
		c.mu.Lock()
		drained, fatal, progress := c.acked >= target(), c.fatal, c.progress
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
			drained, fatal = c.acked >= target(), c.fatal
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
	// Trim in place, clearing the slots so the acknowledged events can be
	// freed: copying what is left would cost every Ack the whole backlog
	// (quadratic while thousands of events wait); append moves the rest to
	// a new array when it next grows.
	n := 0
	for n < len(c.buf) && c.buf[n].GetSeq() <= seq {
		c.bufBytes -= c.sizeOf(c.buf[n])
		c.buf[n] = nil
		n++
	}
	c.buf = c.buf[n:]
	c.acked = seq
	if c.refillLocked() {
		c.wakeSender()
	}
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

// Retryable reports whether a stream error is worth a reconnect: everything
// but a definite refusal is (rpcretry.Retryable, the rule the runner uses for
// every control-plane call).
func Retryable(err error) bool { return rpcretry.Retryable(err) }

func (c *Client) loop(ctx context.Context) {
	defer close(c.done)
	defer func() {
		if c.beat != nil {
			c.beat.Stop()
		}
	}()
	b := rpcretry.NewBackOff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
	for {
		stable, err := c.session(ctx)
		switch {
		case ctx.Err() != nil, c.drained():
			return
		case c.finished(err):
			return
		case !Retryable(err):
			c.log.Error("events stream failed", "error", err)
			c.mu.Lock()
			c.failLocked(err)
			c.mu.Unlock()
			return
		}
		if stable {
			b.Reset()
		}
		if !c.wait(ctx, b, err) {
			return
		}
	}
}

// wait sleeps the next backoff delay; false means stop (Close gave up or ctx ended).
func (c *Client) wait(ctx context.Context, b *backoff.ExponentialBackOff, err error) bool {
	delay := b.NextBackOff()
	c.log.Warn("events stream interrupted; reconnecting", "error", err, "delay", delay, "pending", c.Pending())
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.closeSend: // Close has flushed or given up
		return false
	case <-ctx.Done():
		return false
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
// stable reports a stream that worked (an Ack, or long enough alive) after
// which reconnecting may start again from the shortest delay.
func (c *Client) session(ctx context.Context) (stable bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, w, err := c.open(sctx, cancel)
	if err != nil {
		return false, err
	}
	started := time.Now()
	c.ackUpTo(w.GetLastPersistedSeq())
	c.connOnce.Do(func() { close(c.connected) })
	c.startHeartbeats(w)
	c.log.Info("events stream connected", "last_persisted_seq", w.GetLastPersistedSeq(), "pending", c.Pending())

	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		c.send(sctx, stream, w.GetLastPersistedSeq()+1)
	}()
	defer func() { cancel(); <-senderDone }()
	acked := false
	for {
		m, err := stream.Recv()
		if err != nil {
			return acked || time.Since(started) >= stableSession, err
		}
		switch msg := m.GetMsg().(type) {
		case *taskrunnerv1.ConnectResponse_Ack:
			acked = true
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

// open starts a stream and says Hello. The call waits for the connection to be ready
// (WaitForReady) instead of failing at once while grpc-go reconnects: the stream then starts
// the moment the service is back, rather than at the next turn of this client's backoff on top
// of grpc-go's. While it waits, Close must still be able to end it: closeSend cancels it.
func (c *Client) open(ctx context.Context, cancel context.CancelFunc) (taskrunnerv1.EventsService_ConnectClient, *taskrunnerv1.Welcome, error) {
	opened := make(chan struct{})
	defer close(opened)
	go func() {
		select {
		case <-c.closeSend: // everything is acknowledged, or Close gave up
			cancel()
		case <-opened:
		}
	}()
	slow := time.AfterFunc(waitingLog, func() {
		c.log.Warn("events service not reachable yet; waiting for it", "connection", c.conn.GetState().String(), "pending", c.Pending())
	})
	defer slow.Stop()

	stream, err := c.rpc.Connect(ctx, grpc.WaitForReady(true))
	if err != nil {
		return nil, nil, err
	}
	if err := stream.Send(&taskrunnerv1.ConnectRequest{Msg: &taskrunnerv1.ConnectRequest_Hello{Hello: &taskrunnerv1.Hello{
		TaskId: c.cfg.TaskID, ProtocolVersion: taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1, RunnerVersion: c.cfg.RunnerVersion,
		Run: c.cfg.Run,
	}}}); err != nil {
		_, err = stream.Recv() // the real status
		return nil, nil, err
	}
	m, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	w := m.GetWelcome()
	if w == nil {
		// A protocol error, not an outage: retrying would only repeat it.
		return nil, nil, status.Error(codes.FailedPrecondition, "eventsclient: server did not answer Hello with Welcome")
	}
	return stream, w, nil
}

// startHeartbeats starts the heartbeat ticker at the first Welcome and keeps it afterwards:
// only a different interval from the server resets it.
func (c *Client) startHeartbeats(w *taskrunnerv1.Welcome) {
	interval := c.cfg.HeartbeatInterval
	if interval <= 0 {
		interval = time.Duration(w.GetHeartbeatIntervalSeconds()) * time.Second
	}
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	switch {
	case c.beat == nil:
		c.beat = time.NewTicker(interval)
	case interval != c.beatEvery:
		c.beat.Reset(interval)
	}
	c.beatEvery = interval
}

// send writes buffered events from seq next on, and heartbeats, until the
// stream fails (the receiver then sees why) or Close has flushed.
func (c *Client) send(ctx context.Context, stream grpc.BidiStreamingClient[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse], next int64) {
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
		case <-c.beat.C:
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

// MaxSessionBytes is the largest session archive the Events service stores.
const MaxSessionBytes = 8 << 20

// sessionMsgBytes bounds a session RPC's message: the archive and the few fields around it.
// grpc-go's default receive limit is 4 MiB, below the archive's; the server needs the same
// allowance (grpc.MaxRecvMsgSize) for SaveSession.
const sessionMsgBytes = MaxSessionBytes + 64<<10

// ErrSessionTooLarge is returned by SaveSession for an archive over MaxSessionBytes.
var ErrSessionTooLarge = errors.New("eventsclient: session archive over 8 MiB")

// sessionAttempt bounds one SaveSession or LoadSession call; the caller's context bounds all.
const sessionAttempt = 30 * time.Second

// SaveSession stores the agent's session for the task's next run (EventsService.SaveSession
// on the events connection), retrying what rpcretry retries until ctx ends. The archive must
// already be redacted.
func (c *Client) SaveSession(ctx context.Context, req *taskrunnerv1.SaveSessionRequest) error {
	if len(req.GetArchive()) > MaxSessionBytes {
		return ErrSessionTooLarge
	}
	req = proto.Clone(req).(*taskrunnerv1.SaveSessionRequest)
	req.TaskId = c.cfg.TaskID
	_, err := rpcretry.Do(ctx, rpcretry.Policy{MinDelay: c.cfg.MinBackoff, MaxDelay: c.cfg.MaxBackoff, AttemptTimeout: sessionAttempt},
		func(ctx context.Context) (*taskrunnerv1.SaveSessionResponse, error) {
			return c.rpc.SaveSession(ctx, req, grpc.WaitForReady(true), grpc.MaxCallSendMsgSize(sessionMsgBytes))
		})
	return err
}

// LoadSession fetches the newest saved session of the task (found is false when there is
// none), retrying like SaveSession.
func (c *Client) LoadSession(ctx context.Context) (*taskrunnerv1.LoadSessionResponse, error) {
	return rpcretry.Do(ctx, rpcretry.Policy{MinDelay: c.cfg.MinBackoff, MaxDelay: c.cfg.MaxBackoff, AttemptTimeout: sessionAttempt},
		func(ctx context.Context) (*taskrunnerv1.LoadSessionResponse, error) {
			return c.rpc.LoadSession(ctx, &taskrunnerv1.LoadSessionRequest{TaskId: c.cfg.TaskID}, grpc.WaitForReady(true),
				grpc.MaxCallRecvMsgSize(sessionMsgBytes))
		})
}
