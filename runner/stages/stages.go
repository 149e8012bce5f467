package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/taskrunner/taskrunner/platform/redact"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/pr"
	"github.com/taskrunner/taskrunner/runner/repotoken"
	"github.com/taskrunner/taskrunner/runner/workspace"
)

// Task is what the runner was asked to do.
type Task struct {
	ID, Repo, BaseBranch, Prompt string
	// TraceParent is the W3C traceparent of the dispatch span ("" if none).
	TraceParent string
	// Deadline is the hard deadline (zero: none).
	Deadline time.Time
	// MaxBudgetUSD stops the run when its cost reaches it (0: no budget).
	MaxBudgetUSD float64

	// Run is the task's run (0 or 1: the first). A follow-up (Run > 1) revises the task's
	// pull request PRNumber (PRURL) with Followup; Prompt stays the original request.
	Run      int
	Followup string
	PRNumber int64
	PRURL    string
	// ConsoleURL and TraceURLTemplate make the links of the PR text (see pr.ConsoleLink and
	// pr.TraceLink); empty: no console link, the bare trace id.
	ConsoleURL, TraceURLTemplate string
}

// FollowUp tells whether the task is a follow-up run.
func (t Task) FollowUp() bool { return t.Run > 1 }

// run is the task's run number (1 for the first).
func (t Task) run() int { return max(t.Run, 1) }

// Options are the runner's dependencies.
type Options struct {
	Task      Task
	Reporter  Reporter
	Tokens    repotoken.Source
	Agent     agent.Agent
	Workspace *workspace.Workspace
	// OpenSpecBin runs `openspec init` (default "openspec"); OpenSpecTool is the --tools value
	// (default "claude").
	OpenSpecBin, OpenSpecTool string
	Redactor                  *redact.Redactor
	Logger                    *slog.Logger
	// HTTPClient calls the forge's REST API (default: a client with a timeout).
	HTTPClient *http.Client
	// LogInterval and LogMaxLines limit log events (defaults 250 ms, 200 lines).
	LogInterval time.Duration
	LogMaxLines int
	// FinishTimeout bounds saving the partial work after a timeout (default 2 min).
	FinishTimeout time.Duration
	// Expired, when closed, acts as the deadline passing (tests; the control plane's own
	// timeout signal could use it too).
	Expired <-chan struct{}
	// MeteredOutside is set when the control plane's model proxy meters every model call and
	// records the task's usage itself: the runner then sends no Usage events (its agent-reported
	// totals would overwrite the proxy's on the task row).
	MeteredOutside bool
	// Sessions saves the agent's session at the end of the run and loads the previous run's
	// at the start of a follow-up (nil: neither; a follow-up then starts cold).
	Sessions SessionStore
	// SessionTimeout bounds saving or loading the session (default 1 min).
	SessionTimeout time.Duration
}

// Status is how a run ended.
type Status int

// Run outcomes.
const (
	StatusCompleted Status = iota
	StatusFailed
	StatusCancelled
)

func (s Status) String() string {
	return [...]string{"completed", "failed", "cancelled"}[s]
}

// Outcome is the terminal event the runner reported.
type Outcome struct {
	Status   Status
	Reason   string
	PRURL    string
	PRNumber int64
}

// CancelledError is the cause of a context cancelled on request (a server Cancel or a signal).
type CancelledError struct{ Reason string }

func (e *CancelledError) Error() string { return "cancelled: " + e.Reason }

// ErrTimeout is the cause of a context ended by the hard deadline.
var ErrTimeout = errors.New("timeout")

// MaxReasonBytes bounds failure reasons.
const MaxReasonBytes = 1024

var stageOrder = []taskrunnerv1.TaskStage{
	taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE,
	taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE,
	taskrunnerv1.TaskStage_TASK_STAGE_APPLY,
	taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE,
}

// StageName is the short name of a stage ("explore" …).
func StageName(s taskrunnerv1.TaskStage) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "TASK_STAGE_"))
}

type run struct {
	opts Options
	task Task
	ws   *workspace.Workspace
	red  *redact.Redactor
	log  *slog.Logger
	emit *emitter
	trk  *tracker

	costs     []pr.StageCost
	totalCost float64
	tokensIn  int64
	tokensOut int64
	// stagesRun counts the stages the agent was started for (a session worth saving).
	stagesRun int
	// lastText is the agent's last message (a follow-up's comment falls back on it).
	lastText string
	// target is the pull request of a follow-up, once checked.
	target pr.Target
}

var tracer = otel.Tracer("github.com/taskrunner/taskrunner/runner/stages")

// Run performs the task and reports everything through opts.Reporter, ending with exactly one
// terminal event (Completed, Failed or Cancelled), which it also returns. Cancelling ctx with
// a *CancelledError cause reports Cancelled; any other end of ctx reports Failed.
func Run(ctx context.Context, opts Options) Outcome {
	if opts.OpenSpecBin == "" {
		opts.OpenSpecBin = "openspec"
	}
	if opts.OpenSpecTool == "" {
		opts.OpenSpecTool = "claude"
	}
	if opts.FinishTimeout <= 0 {
		opts.FinishTimeout = 2 * time.Minute
	}
	if opts.SessionTimeout <= 0 {
		opts.SessionTimeout = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Redactor == nil {
		opts.Redactor, _ = redact.New(nil)
	}
	r := &run{opts: opts, task: opts.Task, ws: opts.Workspace, red: opts.Redactor, log: opts.Logger}
	r.emit = newEmitter(opts.Reporter, r.red, r.log, opts.LogInterval, opts.LogMaxLines)
	defer r.emit.close()
	r.trk = &tracker{onEnter: func(stage taskrunnerv1.TaskStage, change string) {
		r.log.Info("stage", "stage", StageName(stage), "change", change)
		r.emit.send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: stage, Change: change}}})
	}}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !r.task.Deadline.IsZero() {
		var stop context.CancelFunc
		runCtx, stop = context.WithDeadlineCause(runCtx, r.task.Deadline, ErrTimeout)
		defer stop()
	}
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		select {
		case reason := <-opts.Reporter.Cancelled():
			if reason == "" {
				reason = "cancelled by the server"
			}
			cancel(&CancelledError{Reason: reason})
		case <-opts.Expired:
			cancel(ErrTimeout)
		case <-runCtx.Done():
		case <-watchDone:
		}
	}()

	opened, err := r.work(runCtx)
	if err == nil {
		out := Outcome{Status: StatusCompleted, PRURL: opened.URL, PRNumber: opened.Number}
		r.saveSession()
		r.emit.send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Completed{Completed: &taskrunnerv1.Completed{PrUrl: opened.URL, PrNumber: opened.Number}}})
		return out
	}

	cause := context.Cause(runCtx)
	if runCtx.Err() == nil {
		cause = nil
	}
	var cancelled *CancelledError
	switch {
	case errors.As(cause, &cancelled):
		r.log.Info("cancelled", "reason", cancelled.Reason)
		reason := r.reason(cancelled.Reason)
		r.saveSession()
		r.emit.send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Cancelled{Cancelled: &taskrunnerv1.Cancelled{Reason: reason}}})
		return Outcome{Status: StatusCancelled, Reason: reason}
	case errors.Is(cause, ErrTimeout):
		return r.fail("timeout", true)
	case cause != nil:
		return r.fail(fmt.Sprintf("stopped: %v", cause), false)
	case errors.Is(err, agent.ErrLimit):
		return r.fail(err.Error(), true)
	default:
		return r.fail(err.Error(), false)
	}
}

// fail reports Failed; with partial, it first saves the work so far in a draft PR.
func (r *run) fail(reason string, partial bool) Outcome {
	r.log.Warn("task failed", "reason", r.reason(reason))
	out := Outcome{Status: StatusFailed}
	if partial && r.ws.Cloned() {
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.FinishTimeout)
		opened, err := r.finish(ctx, reason)
		cancel()
		switch {
		case err != nil:
			reason += " (the partial work could not be saved: " + err.Error() + ")"
		case opened.URL == "":
			reason += " (no changes to save)"
		default:
			out.PRURL, out.PRNumber = opened.URL, opened.Number
		}
	}
	out.Reason = r.reason(reason)
	r.saveSession()
	r.emit.send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: out.Reason, PrUrl: out.PRURL, PrNumber: out.PRNumber}}})
	return out
}

// reason redacts and bounds a failure reason.
func (r *run) reason(s string) string {
	return redact.Truncate(strings.TrimSpace(r.red.Line(s)), MaxReasonBytes)
}

// observer feeds the agent's activity to the tracker and the log tail.
type observer struct{ r *run }

func (o observer) Log(lines ...string) {
	stage, _ := o.r.trk.current()
	o.r.emit.lines(stage, lines...)
}
func (o observer) FileTouched(p string) { o.r.trk.fileTouched(p) }
func (o observer) Command(c string)     { o.r.trk.command(c) }

// logf adds one runner line to the log tail.
func (r *run) logf(format string, args ...any) {
	stage, _ := r.trk.current()
	r.emit.lines(stage, fmt.Sprintf(format, args...))
}

func (r *run) work(ctx context.Context) (pr.Opened, error) {
	tok, err := r.opts.Tokens.Token(ctx)
	if err != nil {
		if errors.Is(err, repotoken.ErrAuth) {
			return pr.Opened{}, err
		}
		return pr.Opened{}, fmt.Errorf("repository token: %w", err)
	}
	r.red.AddLiteral(tok.Value)
	if tok.Repo != "" && !strings.EqualFold(tok.Repo, r.task.Repo) {
		return pr.Opened{}, fmt.Errorf("repository token is for %s, not %s", tok.Repo, r.task.Repo)
	}
	if tok.Repo == "" {
		tok.Repo = r.task.Repo
	}
	if r.task.FollowUp() {
		if err := r.checkPR(ctx, tok); err != nil {
			return pr.Opened{}, err
		}
	}
	r.logf("cloning %s (branch %s)", r.task.Repo, r.cloneBranch())
	if err := r.ws.Clone(ctx, tok.CloneURL(), tok.Value); err != nil {
		var ge *workspace.Error
		if errors.As(err, &ge) {
			switch ge.Kind {
			case workspace.KindAuth:
				return pr.Opened{}, fmt.Errorf("clone %s: authentication failed: the forge refused the repository token", r.task.Repo)
			case workspace.KindRepoNotFound:
				return pr.Opened{}, fmt.Errorf("clone %s: repository not found", r.task.Repo)
			case workspace.KindBranchNotFound:
				if r.task.FollowUp() {
					return pr.Opened{}, fmt.Errorf("clone %s: the task branch %q not found", r.task.Repo, r.ws.Branch())
				}
				return pr.Opened{}, fmt.Errorf("clone %s: base branch %q not found", r.task.Repo, r.task.BaseBranch)
			}
		}
		return pr.Opened{}, fmt.Errorf("clone %s: %w", r.task.Repo, err)
	}
	if err := r.prepareOpenSpec(ctx); err != nil {
		return pr.Opened{}, err
	}
	prompt := r.task.Prompt
	if r.task.FollowUp() {
		r.restoreSession(ctx)
		if prompt, err = r.followupPrompt(ctx); err != nil {
			return pr.Opened{}, err
		}
	}

	for _, stage := range r.stages() {
		r.trk.enter(stage)
		_, change := r.trk.current()
		req := agent.StageRequest{Stage: stage, Prompt: prompt, Change: change}
		if stage == taskrunnerv1.TaskStage_TASK_STAGE_APPLY || stage == taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE {
			if req.Change == "" {
				return pr.Opened{}, errors.New("the propose stage produced no OpenSpec change under openspec/changes/")
			}
		}
		sctx, span := tracer.Start(ctx, "stage."+StageName(stage), trace.WithAttributes(
			attribute.String("taskrunner.task_id", r.task.ID), attribute.String("taskrunner.stage", StageName(stage))))
		r.stagesRun++
		res, err := r.opts.Agent.RunStage(sctx, req, observer{r})
		if res.Text != "" {
			r.lastText = res.Text
		}
		span.SetAttributes(attribute.Float64("taskrunner.cost_usd", res.CostUSD), attribute.Int64("taskrunner.tokens_in", res.TokensIn),
			attribute.Int64("taskrunner.tokens_out", res.TokensOut))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		r.account(stage, res)
		if stage != taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE || err != nil {
			r.sendUsage()
		}
		if err != nil {
			return pr.Opened{}, fmt.Errorf("%s stage: %w", StageName(stage), err)
		}
		if b := r.task.MaxBudgetUSD; b > 0 && r.totalCost >= b {
			return pr.Opened{}, &agent.Error{Reason: fmt.Sprintf("budget exceeded: spent %.4f of %.4f USD", r.totalCost, b), Limit: true}
		}
		switch stage {
		case taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE:
			if _, change := r.trk.current(); change == "" {
				if cs := r.ws.Changes(); len(cs) > 0 {
					r.trk.mu.Lock()
					r.trk.setChange(cs[0])
					r.trk.mu.Unlock()
				}
			}
		case taskrunnerv1.TaskStage_TASK_STAGE_APPLY:
			if err := r.sendDiffStats(ctx); err != nil {
				return pr.Opened{}, err
			}
		case taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE:
			if !r.ws.Archived(change) {
				r.logf("warning: the change %s was not archived", change)
			}
		}
	}
	return r.finish(ctx, "")
}

// account records a stage's usage.
func (r *run) account(stage taskrunnerv1.TaskStage, res agent.Result) {
	if !res.Reported {
		return
	}
	r.costs = append(r.costs, pr.StageCost{Stage: StageName(stage), CostUSD: res.CostUSD})
	// The run's own cost: a resumed conversation's totals include earlier runs.
	r.totalCost += res.CostUSD
	r.tokensIn += res.TokensIn
	r.tokensOut += res.TokensOut
}

func (r *run) sendUsage() {
	if r.opts.MeteredOutside {
		return
	}
	r.emit.send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Usage{Usage: &taskrunnerv1.Usage{
		CostUsd: r.totalCost, TokensIn: r.tokensIn, TokensOut: r.tokensOut,
	}}})
}

func (r *run) sendDiffStats(ctx context.Context) error {
	st, err := r.ws.DiffStats(ctx)
	if err != nil {
		return fmt.Errorf("diff stats: %w", err)
	}
	r.emit.send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{
		Additions: st.Additions, Deletions: st.Deletions, FilesChanged: st.FilesChanged,
	}}})
	return nil
}

// finish reports the final diff stats and usage, commits, pushes and opens the PR. With a
// non-empty incomplete reason the PR is a draft marked incomplete, and having nothing to
// commit is not an error (Opened is then empty).
func (r *run) finish(ctx context.Context, incomplete string) (pr.Opened, error) {
	if err := r.sendDiffStats(ctx); err != nil {
		return pr.Opened{}, err
	}
	if incomplete == "" {
		r.sendUsage()
	}
	_, change := r.trk.current()
	ch := pr.Change{Name: change}
	if change != "" {
		ch.Dir = r.ws.ChangeDir(change)
	}
	title, summary := ch.Proposal()
	if title == "" {
		title = "taskrunner: " + redact.Truncate(firstLine(r.task.Prompt), 100)
	}
	title = r.red.Line(title)
	summary = r.red.String(summary)
	msg := title + "\n\n" + redact.Truncate(summary, 4000)
	if incomplete != "" {
		title = "[incomplete] " + title
		msg = title + "\n\nThe task stopped before finishing: " + r.reason(incomplete)
	}
	msg = strings.TrimSpace(msg) + "\n\nTask: " + r.task.ID + "\n"
	if r.task.FollowUp() {
		msg += fmt.Sprintf("Run: %d\n", r.task.run())
	}
	committed, err := r.ws.Commit(ctx, msg)
	if err != nil {
		return pr.Opened{}, fmt.Errorf("commit: %w", err)
	}
	if !committed {
		ahead, err := r.ws.Ahead(ctx)
		if err != nil {
			return pr.Opened{}, err
		}
		if !ahead {
			if incomplete != "" {
				return pr.Opened{}, nil
			}
			return pr.Opened{}, errors.New("the agent made no changes to commit")
		}
	}
	// Asks for a new token when the current one has less than 5 minutes left.
	tok, err := r.opts.Tokens.Token(ctx)
	if err != nil {
		return pr.Opened{}, fmt.Errorf("repository token: %w", err)
	}
	r.red.AddLiteral(tok.Value)
	if tok.Repo == "" {
		tok.Repo = r.task.Repo
	}
	r.logf("pushing %s", r.ws.Branch())
	if err := r.ws.Push(ctx, tok.CloneURL(), tok.Value); err != nil {
		var ge *workspace.Error
		if errors.As(err, &ge) && ge.Kind == workspace.KindAuth {
			return pr.Opened{}, fmt.Errorf("push %s: authentication failed: the forge refused the repository token", r.ws.Branch())
		}
		return pr.Opened{}, fmt.Errorf("push: %w", err)
	}
	run := pr.Run{Number: r.task.run(), Change: change, Costs: r.costs, Incomplete: r.reasonOrEmpty(incomplete)}
	if r.task.FollowUp() {
		return r.reportRevision(ctx, tok, run, summary)
	}
	opened, err := pr.Open(ctx, pr.Request{
		Repo: r.task.Repo, Head: r.ws.Branch(), Base: r.task.BaseBranch,
		Title: redact.Truncate(title, 250), Body: pr.Body(r.task.ID, summary, run, r.links()),
		Draft: incomplete != "", APIBaseURL: tok.APIBaseURL, Token: tok.Value,
		TraceParent: r.task.TraceParent, HTTPClient: r.opts.HTTPClient,
	})
	if err != nil {
		return pr.Opened{}, err
	}
	r.logf("opened %s", opened.URL)
	return opened, nil
}

func (r *run) reasonOrEmpty(s string) string {
	if s == "" {
		return ""
	}
	return r.reason(s)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
