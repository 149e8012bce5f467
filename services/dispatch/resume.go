package dispatch

import (
	"context"
	"time"
)

// strandedStarts are the admitted tasks whose sandbox was never created: a
// sandboxes row still 'creating' without an external id, of a task that is
// running and not past its deadline (the reaper fails those), written
// before this server was made (so by a Dispatch that is gone, or one on
// another replica that may still be at it: Provider.Create is idempotent
// per task, so starting it again never makes a second sandbox).
const strandedStarts = `SELECT DISTINCT s.task_id::text, t.deadline_at FROM sandboxes s JOIN tasks t ON t.id = s.task_id
WHERE s.state = 'creating' AND s.external_id = '' AND s.destroyed_at IS NULL
  AND t.status = 'running' AND t.deadline_at > now() AND s.created_at < $1
ORDER BY 1`

// Resume starts the sandboxes of admitted tasks whose start was lost: a
// control plane killed between the admission's commit and Provider.Create
// left them running with no runner, and without this the reaper would fail
// them runner_lost a silence window later. It launches each in the
// background (see start) and returns how many. RunReaper calls it once
// when it begins.
func (s *Server) Resume(ctx context.Context) (int, error) {
	rows, err := s.d.Pool.Query(ctx, strandedStarts, s.born)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var found []admitted
	for rows.Next() {
		var a admitted
		var deadline *time.Time
		if err := rows.Scan(&a.id, &deadline); err != nil {
			return 0, err
		}
		if deadline != nil {
			a.deadline = *deadline
		}
		found = append(found, a)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, a := range found {
		s.log.InfoContext(ctx, "dispatch: starting the sandbox of a task admitted before a restart", "task_id", a.id)
		s.launch(ctx, a)
	}
	return len(found), nil
}
