package rpcserver_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/testkit"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/rpcserver"
)

func TestSubsetAndWithout(t *testing.T) {
	desc := &taskrunnerv1.EventsService_ServiceDesc
	sub := rpcserver.Subset(desc, taskrunnerv1.EventsService_Connect_FullMethodName)
	require.Empty(t, sub.Methods)
	require.Len(t, sub.Streams, 1)
	require.Equal(t, "Connect", sub.Streams[0].StreamName)
	require.Equal(t, desc.ServiceName, sub.ServiceName)

	rest := rpcserver.Without(desc, taskrunnerv1.EventsService_Connect_FullMethodName)
	var names []string
	for _, m := range rest.Methods {
		names = append(names, m.MethodName)
	}
	for _, s := range rest.Streams {
		names = append(names, s.StreamName)
	}
	require.NotContains(t, names, "Connect")
	require.Contains(t, names, "Subscribe")
	require.Contains(t, names, "ListEvents")
	require.Len(t, desc.Streams, len(rest.Streams)+1, "the original is unchanged")

	require.Panics(t, func() { rpcserver.Subset(desc, taskrunnerv1.TaskService_ListTasks_FullMethodName) })
}

func TestReflectionIsOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		srv := rpcserver.New(rpcserver.Options{Logger: slog.New(slog.DiscardHandler), Reflection: on})
		conn := testkit.ServeConn(t, srv)
		rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
		require.NoError(t, err)
		// Send may see io.EOF when the server already ended the stream
		// (reflection off): the status comes from Recv.
		if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); !errors.Is(err, io.EOF) {
			require.NoError(t, err)
		}
		_, err = rs.Recv()
		if on {
			require.NoError(t, err)
		} else {
			require.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
		}
	}
}

// logTasks answers GetTask and CancelTask without doing anything.
type logTasks struct {
	taskrunnerv1.UnimplementedTaskServiceServer
}

func (logTasks) GetTask(context.Context, *taskrunnerv1.GetTaskRequest) (*taskrunnerv1.GetTaskResponse, error) {
	return &taskrunnerv1.GetTaskResponse{}, nil
}

func (logTasks) CancelTask(context.Context, *taskrunnerv1.CancelTaskRequest) (*taskrunnerv1.CancelTaskResponse, error) {
	return &taskrunnerv1.CancelTaskResponse{}, nil
}

// TestReadsLogAtDebug: a successful read (every SSE connect makes one)
// writes no line at Info; a change and a failed read do.
func TestReadsLogAtDebug(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	lg := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	srv := rpcserver.New(rpcserver.Options{Logger: lg, Anonymous: map[string]bool{
		taskrunnerv1.TaskService_GetTask_FullMethodName: true, taskrunnerv1.TaskService_CancelTask_FullMethodName: true,
		taskrunnerv1.TaskService_ListTasks_FullMethodName: true,
	}})
	taskrunnerv1.RegisterTaskServiceServer(srv, logTasks{})
	c := taskrunnerv1.NewTaskServiceClient(testkit.ServeConn(t, srv))
	ctx := context.Background()
	lines := func() string {
		mu.Lock()
		defer mu.Unlock()
		s := buf.String()
		buf.Reset()
		return s
	}
	for range 3 {
		_, err := c.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: "x"})
		require.NoError(t, err)
	}
	require.Empty(t, lines(), "successful reads are not logged at Info")
	_, err := c.CancelTask(ctx, &taskrunnerv1.CancelTaskRequest{Id: "x"})
	require.NoError(t, err)
	require.Contains(t, lines(), "CancelTask")
	_, err = c.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{})
	require.Equal(t, codes.Unimplemented, status.Code(err))
	require.Contains(t, lines(), "ListTasks", "a failed read is logged")
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
