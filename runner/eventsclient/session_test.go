package eventsclient_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
)

// sessionServer adds SaveSession and LoadSession to eventsServer: it keeps the newest session
// per task and fails the first failFirst calls with Unavailable, like a restarting server.
type sessionServer struct {
	*eventsServer

	smu       sync.Mutex
	sessions  map[string]*taskrunnerv1.SaveSessionRequest
	failFirst int
	calls     int
}

func (s *sessionServer) flaky() error {
	s.smu.Lock()
	defer s.smu.Unlock()
	s.calls++
	if s.calls <= s.failFirst {
		return status.Error(codes.Unavailable, "restarting")
	}
	return nil
}

func (s *sessionServer) SaveSession(_ context.Context, req *taskrunnerv1.SaveSessionRequest) (*taskrunnerv1.SaveSessionResponse, error) {
	if err := s.flaky(); err != nil {
		return nil, err
	}
	if len(req.GetArchive()) > 8<<20 {
		return nil, status.Error(codes.InvalidArgument, "archive over 8 MiB")
	}
	s.smu.Lock()
	defer s.smu.Unlock()
	s.sessions[req.GetTaskId()] = proto.Clone(req).(*taskrunnerv1.SaveSessionRequest)
	return &taskrunnerv1.SaveSessionResponse{Size: int64(len(req.GetArchive()))}, nil
}

func (s *sessionServer) LoadSession(_ context.Context, req *taskrunnerv1.LoadSessionRequest) (*taskrunnerv1.LoadSessionResponse, error) {
	if err := s.flaky(); err != nil {
		return nil, err
	}
	s.smu.Lock()
	defer s.smu.Unlock()
	saved, ok := s.sessions[req.GetTaskId()]
	if !ok {
		return &taskrunnerv1.LoadSessionResponse{}, nil
	}
	return &taskrunnerv1.LoadSessionResponse{Found: true, Run: saved.GetRun(), Agent: saved.GetAgent(),
		SessionId: saved.GetSessionId(), Archive: saved.GetArchive()}, nil
}

func TestSessionsRoundTripAndRetry(t *testing.T) {
	svc := &sessionServer{eventsServer: newEventsServer(), sessions: map[string]*taskrunnerv1.SaveSessionRequest{}, failFirst: 2}
	ts := startTCP(t, svc.eventsServer)
	ts.kill()
	ts.svc = svc.eventsServer
	// Serve the session methods too: a fresh server on the same port.
	ts.startWith(svc)
	c := ts.client(t, "task-s", eventsclient.Config{Run: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	got, err := c.LoadSession(ctx)
	require.NoError(t, err, "Unavailable is retried")
	require.False(t, got.GetFound())

	require.NoError(t, c.SaveSession(ctx, &taskrunnerv1.SaveSessionRequest{TaskId: "someone-else", Run: 2, Agent: "claude", SessionId: "s-1", Archive: []byte("tgz")}))
	got, err = c.LoadSession(ctx)
	require.NoError(t, err)
	require.True(t, got.GetFound())
	require.EqualValues(t, 2, got.GetRun())
	require.Equal(t, "claude", got.GetAgent())
	require.Equal(t, "s-1", got.GetSessionId())
	require.Equal(t, []byte("tgz"), got.GetArchive())
	svc.smu.Lock()
	_, wrong := svc.sessions["someone-else"]
	svc.smu.Unlock()
	require.False(t, wrong, "the client always names its own task")

	// The largest archive travels both ways (grpc-go's default limit is 4 MiB).
	big := make([]byte, eventsclient.MaxSessionBytes)
	big[len(big)-1] = 7
	require.NoError(t, c.SaveSession(ctx, &taskrunnerv1.SaveSessionRequest{Run: 3, Agent: "codex", SessionId: "t-9", Archive: big}))
	got, err = c.LoadSession(ctx)
	require.NoError(t, err)
	require.Equal(t, big, got.GetArchive())
	err = c.SaveSession(ctx, &taskrunnerv1.SaveSessionRequest{Archive: make([]byte, eventsclient.MaxSessionBytes+1)})
	require.ErrorIs(t, err, eventsclient.ErrSessionTooLarge)

	// Hello carries the run.
	_, err = c.Send(logLine("x"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.Acked() == 1 }, 10*time.Second, 10*time.Millisecond)
	svc.eventsServer.mu.Lock()
	runs := append([]int32(nil), svc.eventsServer.runs...)
	svc.eventsServer.mu.Unlock()
	require.Equal(t, []int32{2}, runs)
}
