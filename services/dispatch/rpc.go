package dispatch

import (
	"context"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/task"
)

// DispatchService gRPC handlers (internal scope).

// internalTaskCall is every task handler's gate: an internal-scope caller
// and a well-formed task id.
func internalTaskCall(ctx context.Context, taskID string) error {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return err
	}
	return task.ValidateID("task_id", taskID)
}

// Dispatch implements DispatchService.Dispatch (internal scope).
func (s *Server) Dispatch(ctx context.Context, req *taskrunnerv1.DispatchRequest) (*taskrunnerv1.DispatchResponse, error) {
	if err := internalTaskCall(ctx, req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.DispatchTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, err
	}
	resp := &taskrunnerv1.DispatchResponse{Task: task.ToProto(t)}
	if sbs, err := s.sandboxes(ctx, t.ID, false); err == nil && len(sbs) > 0 {
		resp.Sandbox = sbs[0]
	}
	return resp, nil
}

// Cancel implements DispatchService.Cancel (internal scope).
func (s *Server) Cancel(ctx context.Context, req *taskrunnerv1.CancelRequest) (*taskrunnerv1.CancelResponse, error) {
	if err := internalTaskCall(ctx, req.GetTaskId()); err != nil {
		return nil, err
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "cancelled"
	}
	t, err := s.CancelTask(ctx, req.GetTaskId(), reason, task.Actor(req.GetActor()))
	if err != nil {
		return nil, err
	}
	return &taskrunnerv1.CancelResponse{Task: task.ToProto(t)}, nil
}

// StartNextRun implements DispatchService.StartNextRun (internal scope).
func (s *Server) StartNextRun(ctx context.Context, req *taskrunnerv1.StartNextRunRequest) (*taskrunnerv1.StartNextRunResponse, error) {
	if err := internalTaskCall(ctx, req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.StartFollowUp(ctx, req.GetTaskId())
	if err != nil {
		return nil, err
	}
	return &taskrunnerv1.StartNextRunResponse{Task: task.ToProto(t)}, nil
}
