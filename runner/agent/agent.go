package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"

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

// Session is what a later run needs to continue this run's conversation: the agent's id for
// it and the cumulative figures the agent last reported for it, so that the next run's first
// stage counts only its own usage (both CLIs report usage cumulatively over a resumed
// conversation).
type Session struct {
	// ID is Claude Code's session id or Codex's thread id.
	ID string `json:"id"`
	// TotalCostUSD is the session's cost as the agent last reported it (Claude Code).
	TotalCostUSD float64 `json:"total_cost_usd,omitempty"`
	// Token counters as the agent last reported them (Codex).
	InputTokens           int64 `json:"input_tokens,omitempty"`
	CachedInputTokens     int64 `json:"cached_input_tokens,omitempty"`
	OutputTokens          int64 `json:"output_tokens,omitempty"`
	ReasoningOutputTokens int64 `json:"reasoning_output_tokens,omitempty"`
}

// SessionFile is one file of a saved session: Name is its slash-separated name in the
// archive (agent-specific, independent of the sandbox's paths), Path where it is on disk.
type SessionFile struct{ Name, Path string }

// Resumable is an Agent whose conversation can outlive its sandbox: the runner saves the
// session's files at the end of a run and restores them into the next run's sandbox.
type Resumable interface {
	Agent
	// Name is the agent's name ("claude", "codex"); a session is only resumed by the same agent.
	Name() string
	// Session is the current conversation (ID "" before the first stage started it).
	Session() Session
	// SessionFiles lists the files of the current conversation.
	SessionFiles() ([]SessionFile, error)
	// RestorePath is where a file saved under name goes in this sandbox; an error refuses a
	// name the agent does not know (or one that would escape its directory).
	RestorePath(name string) (string, error)
	// Resume makes the next stage continue s, whose files are restored.
	Resume(s Session)
}

// CleanName checks an archive name: slash-separated, relative, without "." or ".."
// elements, under prefix ("claude/"); it returns the part after prefix.
func CleanName(name, prefix string) (string, error) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" || strings.HasPrefix(rest, "/") || strings.Contains(rest, "\\") || strings.ContainsRune(rest, 0) {
		return "", fmt.Errorf("session file %q: not under %s", name, prefix)
	}
	for _, el := range strings.Split(rest, "/") {
		if el == "" || el == "." || el == ".." {
			return "", fmt.Errorf("session file %q: bad path element", name)
		}
	}
	return rest, nil
}
