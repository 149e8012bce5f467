package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

// taskctl runs the CLI in-process against a real TaskService on loopback.
func taskctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := newRoot(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestTokenAndTaskCommandsOverGRPC(t *testing.T) {
	db := storetest.NewDB(t)
	lg := slog.New(slog.DiscardHandler)
	srv := rpcserver.New(rpcserver.Options{Logger: lg, Auth: auth.NewStore(db.Pool)})
	taskrunnerv1.RegisterTaskServiceServer(srv, task.New(task.NewStore(db.Pool), nil, lg))
	taskrunnerv1.RegisterTokenServiceServer(srv, auth.NewTokenServer(auth.NewStore(db.Pool)))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	addr := lis.Addr().String()

	// token create prints the token once; only its hash is stored.
	out, err := taskctl(t, "--database-url", db.URL, "--json", "token", "create", "--owner", "alice", "--name", "laptop")
	require.NoError(t, err, out)
	var tok struct {
		Secret string `json:"secret"`
		Token  struct {
			ID    string `json:"id"`
			Name  string `json:"name"`
			Owner string `json:"owner"`
		} `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &tok))
	require.True(t, strings.HasPrefix(tok.Secret, auth.TokenPrefix))
	require.Equal(t, "alice", tok.Token.Owner)
	require.Equal(t, "laptop", tok.Token.Name)

	common := []string{"--addr", addr, "--token", tok.Secret}
	out, err = taskctl(t, append(common, "--json", "task", "create", "--repo", "acme/widgets", "--prompt", "Add a farewell flag")...)
	require.NoError(t, err, out)
	var createdResp struct {
		Task struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"task"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &createdResp))
	created := createdResp.Task
	require.Equal(t, "TASK_STATUS_PROPOSING", created.Status)

	out, err = taskctl(t, append(common, "task", "get", created.ID)...)
	require.NoError(t, err, out)
	require.Contains(t, out, created.ID)
	require.Regexp(t, `status:\s+proposing`, out)
	require.Contains(t, out, "acme/widgets")

	out, err = taskctl(t, append(common, "task", "list", "--status", "proposing")...)
	require.NoError(t, err, out)
	require.Contains(t, out, created.ID)
	out, err = taskctl(t, append(common, "task", "list", "--status", "done")...)
	require.NoError(t, err, out)
	require.NotContains(t, out, created.ID)

	// Bad input and a bad token come back as the server's errors.
	_, err = taskctl(t, append(common, "task", "create", "--repo", "not-a-repo", "--prompt", "p")...)
	require.ErrorContains(t, err, "repo:")
	_, err = taskctl(t, "--addr", addr, "--token", "trt_wrongwrongwrongwrongwrong", "task", "list")
	require.ErrorContains(t, err, "invalid bearer token")
}
