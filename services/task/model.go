package task

import (
	"slices"
	"strings"
	"time"
)

// Status is a task's lifecycle status as stored.
type Status string

// Statuses, in lifecycle order.
const (
	StatusProposing      Status = "proposing"
	StatusQueued         Status = "queued"
	StatusRunning        Status = "running"
	StatusAwaitingReview Status = "awaiting_review"
	StatusDone           Status = "done"
	StatusFailed         Status = "failed"
	StatusCancelled      Status = "cancelled"
)

// Statuses lists every status.
var Statuses = []Status{StatusProposing, StatusQueued, StatusRunning, StatusAwaitingReview, StatusDone, StatusFailed, StatusCancelled}

// Terminal reports whether nothing can change the task any more.
func (s Status) Terminal() bool {
	return s == StatusDone || s == StatusFailed || s == StatusCancelled
}

// ParseStatus accepts the short name ("proposing") or the proto enum name
// ("TASK_STATUS_PROPOSING"), case-insensitively.
func ParseStatus(v string) (Status, bool) {
	v = strings.ToLower(strings.TrimSpace(v))
	v = strings.TrimPrefix(v, "task_status_")
	s := Status(v)
	return s, slices.Contains(Statuses, s)
}

// Stage is an OpenSpec stage; "" before the first.
type Stage string

// Stages, strictly in order.
const (
	StageNone    Stage = ""
	StageExplore Stage = "explore"
	StagePropose Stage = "propose"
	StageApply   Stage = "apply"
	StageArchive Stage = "archive"
)

// Stages lists the stages in order.
var Stages = []Stage{StageExplore, StagePropose, StageApply, StageArchive}

// Order is the position of the stage (0 for none).
func (s Stage) Order() int { return slices.Index(Stages, s) + 1 }

// Agent names the coding agent.
type Agent string

// Agents.
const (
	AgentClaude Agent = "claude"
	AgentCodex  Agent = "codex"
)

// DiffStats are git diff --numstat totals.
type DiffStats struct {
	Additions, Deletions, FilesChanged int64
}

// Usage is the agent's consumption.
type Usage struct {
	CostUSD             float64
	TokensIn, TokensOut int64
}

// Task is a stored task row.
type Task struct {
	ID, Owner, Repo, BaseBranch, HeadBranch, Prompt string
	Agent                                           Agent
	Status                                          Status
	Stage                                           Stage
	Diff                                            DiffStats
	Usage                                           Usage
	PRURL                                           string
	PRNumber                                        int64
	FailedReason                                    string
	DeadlineAt, HeartbeatAt                         *time.Time
	LastSeq                                         int64
	TraceID                                         string
	Traceparent                                     string
	RetryOf                                         string
	IdempotencyKey                                  string
	QueuedAt                                        *time.Time
	Run                                             int32 // current (or last) run
	CreatedAt, UpdatedAt                            time.Time

	// Only on reads for clients (Get, List): the seq of the newest event on
	// the task's timeline, and its 1-based place in the queue while queued.
	TimelineSeq, QueuePosition int64
	// Only from Store.Get: every run, oldest first.
	Runs []Run
}

// Run is one run of a task: the first, or a follow-up.
type Run struct {
	Number      int32
	Trigger     string // create, api, review, comment
	Prompt      string
	State       string // pending, running, finished, failed
	RequestedBy string
	Diff        DiffStats
	Usage       Usage
	CreatedAt   time.Time
}

// HeadBranch is the branch the runner pushes for a task.
func HeadBranch(id string) string { return "taskrunner/" + id }
