package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/task"
)

// Cancelling: CancelTask asks the runner to stop, waits a grace period, then ends the task and
// destroys the sandbox (or closes the pull request of a task awaiting review).

// CancelTask implements task.Dispatcher. For a running task, Cancel goes
// to the runner over its stream, the runner gets CancelGrace to stop and
// report, then the sandbox is destroyed. For a task awaiting review, its
// pull request is closed with a comment naming who cancelled (through the
// PullRequests dependency: the GitHub App's credentials). The task ends
// cancelled either way, with actor on its timeline.
func (s *Server) CancelTask(ctx context.Context, taskID, reason string, actor task.Actor) (task.Task, error) {
	t, err := s.tasks.Get(ctx, taskID, "")
	if err != nil {
		return task.Task{}, err
	}
	if t.Status.Terminal() {
		return t, errs.Transition("task %s is %s: no further changes are accepted", t.ID, t.Status)
	}
	if actor == "" {
		actor = task.ActorDispatch
	}
	switch t.Status {
	case task.StatusRunning:
		if s.d.Canceller != nil {
			if err := s.d.Canceller.Cancel(ctx, taskID, reason); err != nil {
				s.log.WarnContext(ctx, "could not push Cancel to the runner", "task_id", taskID, "error", err)
			} else {
				s.waitTerminal(ctx, taskID, s.cfg.CancelGrace)
			}
		}
	case task.StatusAwaitingReview:
		if t.PRNumber > 0 {
			if s.d.PullRequests == nil {
				return task.Task{}, errs.Unavailable("cancel: the pull request cannot be closed: no GitHubToken service is configured here")
			}
			comment := fmt.Sprintf("Closed by taskrunner: task %s was cancelled by %s (%s).", t.ID, strings.TrimPrefix(string(actor), "user:"), reason)
			if err := s.d.PullRequests.ClosePullRequest(ctx, t.Repo, int(t.PRNumber), comment); err != nil {
				return task.Task{}, errs.Unavailable("cancel: could not close pull request #" + strconv.FormatInt(t.PRNumber, 10) + ": " + err.Error())
			}
		}
	}
	t, _, err = s.tasks.Advance(ctx, taskID, "", task.Advance{RequestID: "cancel", Status: task.StatusCancelled, FailedReason: reason, Actor: actor})
	if err != nil && !errors.Is(err, errs.ErrInvalidTransition) {
		return task.Task{}, err
	}
	s.destroy(context.WithoutCancel(ctx), taskID, "cancelled")
	return s.tasks.Get(ctx, taskID, "")
}

func (s *Server) waitTerminal(ctx context.Context, taskID string, grace time.Duration) {
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		t, err := s.tasks.Get(ctx, taskID, "")
		if err != nil || t.Status != task.StatusRunning {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
