package eventsclient_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
)

// eventsServer behaves like services/events towards a runner: it stores each task's events
// gap-free by seq, answers Hello with Welcome{last stored seq}, acknowledges every stored
// event, ignores (but acknowledges) a seq it already holds, and refuses an event whose JSON
// form is over 64 KiB with InvalidArgument, as the real server does. Faults are injected with
// failHello (answer Hello with an error) and failAfter (end a stream with an error after n
// events).
type eventsServer struct {
	taskrunnerv1.UnimplementedEventsServiceServer

	mu        sync.Mutex
	stored    map[string][]*taskrunnerv1.Event // seq i+1 at index i
	wire      map[string]int                   // events received, duplicates included
	hellos    map[string][]time.Time
	beats     map[string][]time.Time
	failHello func(task string, attempt int) error
	failAfter func(task string, attempt int) (n int, err error)
	dropAfter time.Duration // end every stream with Unavailable this long after Welcome
	sizeErrs  int
	runs      []int32 // Hello.run of every stream
}

func newEventsServer() *eventsServer {
	return &eventsServer{stored: map[string][]*taskrunnerv1.Event{}, wire: map[string]int{},
		hellos: map[string][]time.Time{}, beats: map[string][]time.Time{}}
}

func (s *eventsServer) Connect(stream grpc.BidiStreamingServer[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse]) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	task := m.GetHello().GetTaskId()
	s.mu.Lock()
	attempt := len(s.hellos[task])
	s.hellos[task] = append(s.hellos[task], time.Now())
	s.runs = append(s.runs, m.GetHello().GetRun())
	last := int64(len(s.stored[task]))
	failHello, failAfter, dropAfter := s.failHello, s.failAfter, s.dropAfter
	s.mu.Unlock()
	if failHello != nil {
		if err := failHello(task, attempt); err != nil {
			return err
		}
	}
	limit, streamErr := -1, error(nil)
	if failAfter != nil {
		limit, streamErr = failAfter(task, attempt)
	}
	if err := stream.Send(&taskrunnerv1.ConnectResponse{Msg: &taskrunnerv1.ConnectResponse_Welcome{Welcome: &taskrunnerv1.Welcome{LastPersistedSeq: last, HeartbeatIntervalSeconds: 10}}}); err != nil {
		return err
	}
	ctx := stream.Context()
	if dropAfter > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, dropAfter, status.Error(codes.Unavailable, "dropped"))
		defer cancel()
	}
	return s.serve(ctx, stream, task, limit, streamErr)
}

// serve stores events until the stream ends, limit events have come (then streamErr), or
// ctx ends (then its cause).
func (s *eventsServer) serve(ctx context.Context, stream grpc.BidiStreamingServer[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse], task string, limit int, streamErr error) error {
	msgs := make(chan *taskrunnerv1.ConnectRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	n := 0
	for {
		var m *taskrunnerv1.ConnectRequest
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m = <-msgs:
		}
		if m.GetHeartbeat() != nil {
			s.mu.Lock()
			s.beats[task] = append(s.beats[task], time.Now())
			s.mu.Unlock()
			continue
		}
		ev := m.GetEvent()
		if ev == nil {
			return status.Error(codes.InvalidArgument, "unexpected message")
		}
		if limit >= 0 && n == limit {
			return streamErr
		}
		n++
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev)
		if err != nil || len(b) > eventsclient.MaxEventBytes {
			s.mu.Lock()
			s.sizeErrs++
			s.mu.Unlock()
			return status.Errorf(codes.InvalidArgument, "event: event %d is %d bytes, more than the limit of %d", ev.GetSeq(), len(b), eventsclient.MaxEventBytes)
		}
		s.mu.Lock()
		s.wire[task]++
		have := int64(len(s.stored[task]))
		switch {
		case ev.GetSeq() == have+1:
			s.stored[task] = append(s.stored[task], ev)
		case ev.GetSeq() > have+1:
			s.mu.Unlock()
			return status.Errorf(codes.FailedPrecondition, "gap: got %d after %d", ev.GetSeq(), have)
		}
		ackSeq := int64(len(s.stored[task]))
		s.mu.Unlock()
		if err := stream.Send(&taskrunnerv1.ConnectResponse{Msg: &taskrunnerv1.ConnectResponse_Ack{Ack: &taskrunnerv1.Ack{Seq: ackSeq}}}); err != nil {
			return err
		}
	}
}

func (s *eventsServer) events(task string) []*taskrunnerv1.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*taskrunnerv1.Event(nil), s.stored[task]...)
}

func (s *eventsServer) helloTimes(task string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.hellos[task]...)
}

func (s *eventsServer) beatTimes(task string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.beats[task]...)
}

// tcpServer serves an eventsServer on a real loopback port that can be killed (every
// connection cut at once, like kill -9 of taskrunnerd) and started again on the same port.
type tcpServer struct {
	t    *testing.T
	svc  *eventsServer
	addr string
	gs   *grpc.Server
	done chan struct{}
}

func startTCP(t *testing.T, svc *eventsServer) *tcpServer {
	ts := &tcpServer{t: t, svc: svc, addr: "127.0.0.1:0"}
	ts.start()
	t.Cleanup(ts.kill)
	return ts
}

// start listens (on the same port after the first time) and serves; it returns once the
// port accepts connections.
func (ts *tcpServer) start() { ts.startWith(ts.svc) }

// startWith is start with another implementation of the service.
func (ts *tcpServer) startWith(svc taskrunnerv1.EventsServiceServer) {
	ts.t.Helper()
	lis, err := net.Listen("tcp", ts.addr)
	require.NoError(ts.t, err)
	ts.addr = lis.Addr().String()
	ts.gs = grpc.NewServer(grpc.MaxRecvMsgSize(9 << 20))
	taskrunnerv1.RegisterEventsServiceServer(ts.gs, svc)
	ts.done = make(chan struct{})
	go func(gs *grpc.Server, done chan struct{}) { defer close(done); _ = gs.Serve(lis) }(ts.gs, ts.done)
}

// kill closes the port and every connection without a goodbye.
func (ts *tcpServer) kill() {
	if ts.gs == nil {
		return
	}
	ts.gs.Stop()
	<-ts.done
	ts.gs = nil
}

// client starts an eventsclient for task against ts with production backoff bounds (the
// reconnect times measured are the real ones).
func (ts *tcpServer) client(t *testing.T, task string, cfg eventsclient.Config) *eventsclient.Client {
	t.Helper()
	cfg.Addr, cfg.TaskID, cfg.Insecure = "passthrough:///"+ts.addr, task, true
	c, err := eventsclient.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = c.Close(cctx)
		cancel()
	})
	return c
}

func logLine(line string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{line}}}}
}

// lines returns every log line of evs, in order.
func lines(evs []*taskrunnerv1.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.GetLog().GetLines()...)
	}
	return out
}

// requireGapFree asserts that evs carry seqs 1..len(evs) in order.
func requireGapFree(t *testing.T, evs []*taskrunnerv1.Event) {
	t.Helper()
	for i, e := range evs {
		require.Equal(t, int64(i+1), e.GetSeq())
	}
}
