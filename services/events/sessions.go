package events

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/task"
)

// runnerTask checks that the caller is the runner of task id (its client
// certificate) and that the task is live, and returns the task.
func (s *Server) runnerTask(ctx context.Context, id string) (task.Task, error) {
	certTask, err := pki.TaskIDFromContext(ctx, s.cfg.TrustDomain)
	if err != nil {
		if errors.Is(err, pki.ErrNoVerifiedCert) {
			return task.Task{}, status.Error(codes.Unauthenticated, "sessions need a runner client certificate issued by the runner CA")
		}
		return task.Task{}, status.Error(codes.PermissionDenied, "the client certificate is not a task identity of this trust domain")
	}
	if id != certTask {
		return task.Task{}, status.Errorf(codes.PermissionDenied, "the client certificate is for task %s, not %q", certTask, id)
	}
	t, err := s.tasks.Get(ctx, id, "")
	if errors.Is(err, errs.ErrNotFound) {
		return task.Task{}, status.Errorf(codes.FailedPrecondition, "task %s does not exist", id)
	}
	if err != nil {
		return task.Task{}, storeUnavailable(err)
	}
	if t.Status.Terminal() {
		return task.Task{}, status.Errorf(codes.FailedPrecondition, "task %s is %s: a finished task's runner has no session to keep", id, t.Status)
	}
	return t, nil
}

// SaveSession implements EventsService: the runner of a live task stores
// its agent's session (redacted by the runner, at most task.MaxSessionBytes).
func (s *Server) SaveSession(ctx context.Context, req *taskrunnerv1.SaveSessionRequest) (*taskrunnerv1.SaveSessionResponse, error) {
	t, err := s.runnerTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, err
	}
	switch {
	case req.GetAgent() != string(task.AgentClaude) && req.GetAgent() != string(task.AgentCodex):
		return nil, errs.Invalid("agent", "want claude or codex, got %q", req.GetAgent())
	case req.GetSessionId() == "" || len(req.GetSessionId()) > 200:
		return nil, errs.Invalid("session_id", "is required (at most 200 bytes)")
	case len(req.GetArchive()) == 0:
		return nil, errs.Invalid("archive", "is empty")
	}
	run := req.GetRun()
	if run == 0 {
		run = max(t.Run, 1)
	}
	if err := s.tasks.SaveSession(ctx, t.ID, task.Session{Run: run, Agent: req.GetAgent(), SessionID: req.GetSessionId(), Archive: req.GetArchive()}); err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "agent session saved", "task_id", t.ID, "run", run, "bytes", len(req.GetArchive()))
	return &taskrunnerv1.SaveSessionResponse{Size: int64(len(req.GetArchive()))}, nil
}

// LoadSession implements EventsService: the newest saved session of the
// runner's task.
func (s *Server) LoadSession(ctx context.Context, req *taskrunnerv1.LoadSessionRequest) (*taskrunnerv1.LoadSessionResponse, error) {
	t, err := s.runnerTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, err
	}
	ss, ok, err := s.tasks.LoadSession(ctx, t.ID)
	if err != nil || !ok {
		return &taskrunnerv1.LoadSessionResponse{}, err
	}
	return &taskrunnerv1.LoadSessionResponse{Found: true, Run: ss.Run, Agent: ss.Agent, SessionId: ss.SessionID, Archive: ss.Archive}, nil
}
