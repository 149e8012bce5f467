package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

// serve runs TaskService and TokenService behind the shared interceptor
// chain on loopback and returns the address and alice's token.
func serve(t *testing.T) (addr string, db *storetest.DB, token string) {
	t.Helper()
	db = storetest.NewDB(t)
	lg := slog.New(slog.DiscardHandler)
	tokens := auth.NewStore(db.Pool)
	srv := rpcserver.New(rpcserver.Options{Logger: lg, Auth: tokens})
	taskrunnerv1.RegisterTaskServiceServer(srv, task.New(task.NewStore(db.Pool), nil, lg))
	taskrunnerv1.RegisterTokenServiceServer(srv, auth.NewTokenServer(tokens))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	token, _, err = tokens.Create(context.Background(), "alice", nil, "")
	require.NoError(t, err)
	return lis.Addr().String(), db, token
}

// requireRESTShape checks that out is exactly what the REST API returns for
// the same call: the response message in protojson with proto field names
// and every field present (the gateway's marshaler options), so it parses
// strictly into resp and has the same top-level keys.
func requireRESTShape(t *testing.T, out string, resp proto.Message) {
	t.Helper()
	require.NoError(t, protojson.Unmarshal([]byte(out), resp), out)
	want, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(resp)
	require.NoError(t, err)
	var got, exp map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.NoError(t, json.Unmarshal(want, &exp))
	require.Equal(t, exp, got)
}

func TestJSONOutputHasTheShapeOfTheRESTResponses(t *testing.T) {
	addr, _, token := serve(t)
	common := []string{"--addr", addr, "--token", token, "--json"}

	out, err := taskctl(t, append(common, "task", "create", "--repo", "acme/widgets", "--prompt", "p")...)
	require.NoError(t, err, out)
	created := &taskrunnerv1.CreateTaskResponse{}
	requireRESTShape(t, out, created)
	id := created.GetTask().GetId()
	require.NotEmpty(t, id)
	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(out), &top))
	require.Equal(t, []string{"task"}, slices.Collect(maps.Keys(top)))
	var fields map[string]any
	require.NoError(t, json.Unmarshal(top["task"], &fields))
	require.Contains(t, fields, "base_branch", "proto field names, as REST")
	require.Contains(t, fields, "pr_url", "unset fields present, as REST")

	out, err = taskctl(t, append(common, "task", "get", id)...)
	require.NoError(t, err, out)
	requireRESTShape(t, out, &taskrunnerv1.GetTaskResponse{})

	out, err = taskctl(t, append(common, "task", "list")...)
	require.NoError(t, err, out)
	list := &taskrunnerv1.ListTasksResponse{}
	requireRESTShape(t, out, list)
	require.Len(t, list.GetTasks(), 1)

	out, err = taskctl(t, append(common, "task", "cancel", id, "--reason", "r")...)
	require.NoError(t, err, out)
	cancelled := &taskrunnerv1.CancelTaskResponse{}
	requireRESTShape(t, out, cancelled)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED, cancelled.GetTask().GetStatus())

	out, err = taskctl(t, append(common, "task", "retry", id)...)
	require.NoError(t, err, out)
	retried := &taskrunnerv1.RetryTaskResponse{}
	requireRESTShape(t, out, retried)
	require.Equal(t, id, retried.GetTask().GetRetryOf())

	out, err = taskctl(t, append(common, "token", "list")...)
	require.NoError(t, err, out)
	requireRESTShape(t, out, &taskrunnerv1.ListTokensResponse{})
}
