package dispatch

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/task"
)

// The sandboxes table: one row per run, read by ListSandboxes.

// ListSandboxes implements DispatchService.ListSandboxes (internal scope).
func (s *Server) ListSandboxes(ctx context.Context, req *taskrunnerv1.ListSandboxesRequest) (*taskrunnerv1.ListSandboxesResponse, error) {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return nil, err
	}
	if id := req.GetTaskId(); id != "" {
		if err := task.ValidateID("task_id", id); err != nil {
			return nil, err
		}
	}
	sbs, err := s.sandboxes(ctx, req.GetTaskId(), req.GetIncludeDestroyed())
	if err != nil {
		return nil, err
	}
	return &taskrunnerv1.ListSandboxesResponse{Sandboxes: sbs}, nil
}

func (s *Server) sandboxes(ctx context.Context, taskID string, includeDestroyed bool) ([]*taskrunnerv1.Sandbox, error) {
	rows, err := s.d.Pool.Query(ctx, `SELECT task_id::text, provider, external_id, state, created_at, destroyed_at FROM sandboxes
WHERE ($1 = '' OR task_id::text = $1) AND ($2 OR destroyed_at IS NULL) ORDER BY created_at DESC LIMIT 500`, taskID, includeDestroyed)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*taskrunnerv1.Sandbox, error) {
		var sb taskrunnerv1.Sandbox
		var created time.Time
		var destroyed *time.Time
		if err := r.Scan(&sb.TaskId, &sb.Provider, &sb.ExternalId, &sb.State, &created, &destroyed); err != nil {
			return nil, err
		}
		sb.CreateTime = timestamppb.New(created)
		if destroyed != nil {
			sb.DestroyTime = timestamppb.New(*destroyed)
		}
		return &sb, nil
	})
}
