package eventsclient_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/testkit"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type connectStream = grpc.BidiStreamingServer[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse]

// fakeServer runs handle for every Connect, numbering the attempts from 0.
type fakeServer struct {
	taskrunnerv1.UnimplementedEventsServiceServer
	mu       sync.Mutex
	attempts int
	handle   func(attempt int, hello *taskrunnerv1.Hello, s connectStream) error
}

func (f *fakeServer) Connect(s connectStream) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	f.mu.Lock()
	n := f.attempts
	f.attempts++
	f.mu.Unlock()
	return f.handle(n, m.GetHello(), s)
}

func start(t *testing.T, f *fakeServer, cfg eventsclient.Config) *eventsclient.Client {
	t.Helper()
	gs := grpc.NewServer()
	taskrunnerv1.RegisterEventsServiceServer(gs, f)
	bufnet := testkit.Serve(t, gs) // stopped after the client below is closed
	cfg.Addr, cfg.TaskID, cfg.Insecure = testkit.Target, "task-1", true
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 10*time.Millisecond
	cfg.DialOptions = []grpc.DialOption{bufnet.Dialer()}
	c, err := eventsclient.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		defer ccancel()
		_ = c.Close(cctx)
		cancel()
	})
	return c
}

func welcome(last int64) *taskrunnerv1.ConnectResponse {
	return &taskrunnerv1.ConnectResponse{Msg: &taskrunnerv1.ConnectResponse_Welcome{Welcome: &taskrunnerv1.Welcome{LastPersistedSeq: last, HeartbeatIntervalSeconds: 10}}}
}

// eachEvent calls fn with each event the client sends on s, until the
// client closes its side (nil) or s or fn fails (that error).
func eachEvent(s connectStream, fn func(*taskrunnerv1.Event) error) error {
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if e := m.GetEvent(); e != nil {
			if err := fn(e); err != nil {
				return err
			}
		}
	}
}

func ack(seq int64) *taskrunnerv1.ConnectResponse {
	return &taskrunnerv1.ConnectResponse{Msg: &taskrunnerv1.ConnectResponse_Ack{Ack: &taskrunnerv1.Ack{Seq: seq}}}
}

func logEvent() *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"l"}}}}
}

func stageEvent() *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE}}}
}

func TestResendsEverythingAfterWelcome(t *testing.T) {
	const n = 50
	var mu sync.Mutex
	seen := map[int][]int64{} // attempt → seqs received
	f := &fakeServer{handle: func(attempt int, hello *taskrunnerv1.Hello, s connectStream) error {
		require.Equal(t, "task-1", hello.GetTaskId())
		require.Equal(t, taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1, hello.GetProtocolVersion())
		last := map[int]int64{0: 0, 1: 4, 2: 20}[attempt] // attempt 1: 5..7 were lost
		if err := s.Send(welcome(last)); err != nil {
			return err
		}
		return eachEvent(s, func(e *taskrunnerv1.Event) error {
			mu.Lock()
			seen[attempt] = append(seen[attempt], e.GetSeq())
			mu.Unlock()
			switch {
			case attempt == 0 && e.GetSeq() == 7: // acked up to 3, then a broken connection
				return status.Error(codes.Unavailable, "connection reset")
			case attempt == 1 && e.GetSeq() == 25: // persisted up to 20, then the server stops
				return status.Error(codes.Aborted, "server restarting")
			case attempt == 0 && e.GetSeq() <= 3, attempt == 2:
				return s.Send(ack(e.GetSeq()))
			}
			return nil
		})
	}}
	c := start(t, f, eventsclient.Config{})
	for i := range n {
		seq, err := c.Send(logEvent())
		require.NoError(t, err)
		require.Equal(t, int64(i+1), seq)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Close(ctx))
	require.Equal(t, int64(n), c.Acked())
	require.NoError(t, c.Err())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, int64(5), seen[1][0], "resent from Welcome.last_persisted_seq+1")
	require.Equal(t, int64(21), seen[2][0])
	require.Equal(t, int64(n), seen[2][len(seen[2])-1])
	for i := 1; i < len(seen[2]); i++ {
		require.Equal(t, seen[2][i-1]+1, seen[2][i], "in order, without gaps")
	}
}

func TestFatalErrorStopsTheClient(t *testing.T) {
	cases := []struct {
		name string
		code codes.Code
	}{
		{name: "permission denied", code: codes.PermissionDenied},
		{name: "failed precondition", code: codes.FailedPrecondition},
		{name: "invalid argument", code: codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeServer{handle: func(int, *taskrunnerv1.Hello, connectStream) error {
				return status.Error(tc.code, "no")
			}}
			c := start(t, f, eventsclient.Config{})
			_, err := c.Send(stageEvent())
			require.NoError(t, err)
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the client kept retrying a fatal error")
			}
			require.Equal(t, tc.code, status.Code(c.Err()))
			_, err = c.Send(logEvent())
			require.Equal(t, tc.code, status.Code(err))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.Equal(t, tc.code, status.Code(c.Close(ctx)))
			f.mu.Lock()
			require.Equal(t, 1, f.attempts)
			f.mu.Unlock()
		})
	}
}

func TestCancelAndHeartbeats(t *testing.T) {
	beat := make(chan struct{}, 1)
	f := &fakeServer{handle: func(_ int, _ *taskrunnerv1.Hello, s connectStream) error {
		if err := s.Send(welcome(0)); err != nil {
			return err
		}
		if err := s.Send(&taskrunnerv1.ConnectResponse{Msg: &taskrunnerv1.ConnectResponse_Cancel{Cancel: &taskrunnerv1.Cancel{Reason: "stop now"}}}); err != nil {
			return err
		}
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			if m.GetHeartbeat() != nil {
				select {
				case beat <- struct{}{}:
				default:
				}
			}
		}
	}}
	c := start(t, f, eventsclient.Config{HeartbeatInterval: 5 * time.Millisecond})
	select {
	case r := <-c.Cancelled():
		require.Equal(t, "stop now", r)
	case <-time.After(10 * time.Second):
		t.Fatal("no cancel")
	}
	select {
	case <-beat:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat")
	}
}

func TestBufferFullRefusesOnlyDroppableEvents(t *testing.T) {
	c, err := eventsclient.New(eventsclient.Config{Addr: "passthrough:///nowhere", TaskID: "task-1", Insecure: true, BufferSize: 2})
	require.NoError(t, err)
	diffEv := &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{Additions: 1}}}
	done := &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Completed{Completed: &taskrunnerv1.Completed{PrUrl: "u"}}}
	steps := []struct {
		ev      *taskrunnerv1.Event
		wantSeq int64
		wantErr error
	}{
		{logEvent(), 1, nil},
		{logEvent(), 2, nil},
		{logEvent(), 0, eventsclient.ErrBufferFull},
		{diffEv, 0, eventsclient.ErrBufferFull},
		{stageEvent(), 3, nil},
		{done, 4, nil},
	}
	for _, s := range steps {
		seq, err := c.Send(s.ev)
		require.ErrorIs(t, err, s.wantErr)
		require.Equal(t, s.wantSeq, seq)
	}
	require.Equal(t, 4, c.Pending())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.Error(t, c.Close(ctx), "unsent events are reported")
	_, err = c.Send(logEvent())
	require.ErrorIs(t, err, eventsclient.ErrClosed)
}

// TestConnectedAfterTheFirstWelcome: Connected stays open while the server
// refuses the stream and closes at the first Welcome.
func TestConnectedAfterTheFirstWelcome(t *testing.T) {
	welcomeNow := make(chan struct{})
	f := &fakeServer{handle: func(attempt int, _ *taskrunnerv1.Hello, s connectStream) error {
		select {
		case <-welcomeNow:
		default:
			return status.Error(codes.Unavailable, "not yet")
		}
		if err := s.Send(welcome(0)); err != nil {
			return err
		}
		for {
			if _, err := s.Recv(); err != nil {
				return nil
			}
		}
	}}
	c := start(t, f, eventsclient.Config{})
	select {
	case <-c.Connected():
		t.Fatal("Connected closed before any Welcome")
	case <-time.After(100 * time.Millisecond):
	}
	close(welcomeNow)
	select {
	case <-c.Connected():
	case <-time.After(5 * time.Second):
		t.Fatal("Connected did not close after the Welcome")
	}
}

func TestWaitAcked(t *testing.T) {
	f := &fakeServer{handle: func(_ int, _ *taskrunnerv1.Hello, s connectStream) error {
		if err := s.Send(welcome(0)); err != nil {
			return err
		}
		return eachEvent(s, func(e *taskrunnerv1.Event) error {
			switch {
			case e.GetSeq() <= 2: // the third is never acknowledged
				return s.Send(ack(e.GetSeq()))
			case e.GetSeq() == 4:
				return status.Error(codes.PermissionDenied, "revoked")
			}
			return nil
		})
	}}
	c := start(t, f, eventsclient.Config{})
	for range 3 {
		_, err := c.Send(logEvent())
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.WaitAcked(ctx, 2))
	require.Equal(t, int64(2), c.Acked())

	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	err := c.WaitAcked(short, 3)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, int64(2), c.Acked())

	_, err = c.Send(logEvent()) // seq 4: the server ends the stream with a fatal code
	require.NoError(t, err)
	require.Equal(t, codes.PermissionDenied, status.Code(c.WaitAcked(ctx, 4)))
}
