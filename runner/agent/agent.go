package agent

import (
	"context"
	"errors"
	"fmt"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Stage is one of the four OpenSpec stages.
type Stage = taskrunnerv1.TaskStage

// StageRequest says which stage to run.
type StageRequest struct {
	Stage Stage
	// Prompt is the task's prompt (explore and propose).
	Prompt string
	// Change is the OpenSpec change name (apply and archive).
	Change string
}

// Observer receives what the agent does while a stage runs. Calls come from one goroutine per
// stage, in the order the agent printed them; implementations must not block.
type Observer interface {
	// Log receives human-readable lines (not yet redacted).
	Log(lines ...string)
	// FileTouched reports a file the agent wrote or edited (absolute or workspace-relative).
	FileTouched(path string)
	// Command reports a shell command the agent ran.
	Command(cmd string)
}

// Result is what one stage consumed.
type Result struct {
	// SessionID is the agent's conversation id.
	SessionID string
	// CostUSD is the cost of this stage; TotalCostUSD the cost of the session so far.
	CostUSD, TotalCostUSD float64
	// TokensIn and TokensOut are this stage's tokens.
	TokensIn, TokensOut int64
	// NumTurns is the number of model turns of this stage.
	NumTurns int
	// Reported is true when the agent printed its result (usage figures are valid).
	Reported bool
	// Text is the agent's final message.
	Text string
}

// Agent runs stages of one task. Implementations keep the conversation across stages.
type Agent interface {
	RunStage(ctx context.Context, req StageRequest, obs Observer) (Result, error)
}

// ErrLimit marks a stage stopped by the turn cap or the budget: the work so far is kept in a
// draft PR.
var ErrLimit = errors.New("agent limit reached")

// Error is an agent failure with the agent's own reason.
type Error struct {
	// Reason is the agent's explanation (not redacted).
	Reason string
	// Limit is true for the turn cap and the budget.
	Limit bool
}

func (e *Error) Error() string { return e.Reason }

// Is makes errors.Is(err, ErrLimit) true for limit errors.
func (e *Error) Is(target error) bool { return target == ErrLimit && e.Limit }

// Errorf builds a non-limit Error.
func Errorf(format string, args ...any) error { return &Error{Reason: fmt.Sprintf(format, args...)} }
