package task

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/taskrunner/taskrunner/platform/telemetry"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
)

var tracer = otel.Tracer("github.com/taskrunner/taskrunner/services/task")

// Dispatcher starts and stops sandboxes; DispatchService implements it, in
// process or over gRPC. Nil until a dispatch service is configured.
type Dispatcher interface {
	DispatchTask(ctx context.Context, taskID string) (Task, error)
	// CancelTask stops a running task's sandbox, or closes the pull request
	// of a task awaiting review, and cancels the task.
	CancelTask(ctx context.Context, taskID, reason string, actor Actor) (Task, error)
	// StartFollowUp starts the task's oldest pending follow-up run when no
	// run is active (admission, quota and capacity as for a dispatch); it
	// does nothing otherwise.
	StartFollowUp(ctx context.Context, taskID string) (Task, error)
}

// Server implements TaskService.
type Server struct {
	taskrunnerv1.UnimplementedTaskServiceServer
	store      *Store
	dispatcher Dispatcher
	log        *slog.Logger
	maxRuns    int
	budgets    Budgets
	repos      RepoChecker // nil: repositories are not checked before spending
	access     accessCache
}

var _ taskrunnerv1.TaskServiceServer = (*Server)(nil)

// New returns the TaskService server. dispatcher may be nil.
func New(store *Store, dispatcher Dispatcher, log *slog.Logger) *Server {
	return &Server{store: store, dispatcher: dispatcher, log: log, maxRuns: DefaultMaxRuns,
		budgets: Budgets{MaxBudgetUSD: DefaultMaxBudgetUSD}, access: accessCache{now: time.Now}}
}

// SetBudgets sets the server's spending limits (TASKRUNNER_MAX_BUDGET_USD,
// TASKRUNNER_OWNER_DAILY_USD); the defaults are a 5 USD task maximum and
// no owner quota.
func (s *Server) SetBudgets(b Budgets) {
	if b.MaxBudgetUSD > 0 {
		s.budgets = b
	}
}

// SetMaxRuns sets the most runs a task may have (the first included;
// TASKRUNNER_MAX_RUNS, default DefaultMaxRuns).
func (s *Server) SetMaxRuns(n int) {
	if n > 0 {
		s.maxRuns = n
	}
}

// SetDispatcher wires the dispatcher once DispatchService exists (the two
// services depend on each other when hosted in one process).
func (s *Server) SetDispatcher(d Dispatcher) { s.dispatcher = d }

func agentFromProto(a taskrunnerv1.Agent) (Agent, error) {
	switch a {
	case taskrunnerv1.Agent_AGENT_UNSPECIFIED, taskrunnerv1.Agent_AGENT_CLAUDE:
		return AgentClaude, nil
	case taskrunnerv1.Agent_AGENT_CODEX:
		return AgentCodex, nil
	}
	return "", errs.Invalid("agent", "unknown agent %d (want AGENT_CLAUDE or AGENT_CODEX)", a)
}

// CreateTask implements TaskService.
func (s *Server) CreateTask(ctx context.Context, req *taskrunnerv1.CreateTaskRequest) (*taskrunnerv1.CreateTaskResponse, error) {
	p, err := auth.RequireScope(ctx, auth.ScopeTasks)
	if err != nil {
		return nil, err
	}
	agent, err := agentFromProto(req.GetAgent())
	if err != nil {
		return nil, err
	}
	n := NewTask{Owner: p.Owner, Repo: req.GetRepo(), BaseBranch: req.GetBaseBranch(), Prompt: req.GetPrompt(),
		Agent: agent, IdempotencyKey: idempotencyKey(ctx, req.GetRequestId())}
	if err := n.Validate(); err != nil {
		return nil, err
	}
	budget := req.GetMaxBudgetUsd()
	switch {
	case math.IsNaN(budget) || math.IsInf(budget, 0) || budget < 0:
		return nil, errs.Invalid("max_budget_usd", "must be a positive number of USD (0: the server's maximum of %.2f)", s.budgets.MaxBudgetUSD)
	case budget > s.budgets.MaxBudgetUSD:
		return nil, errs.Invalid("max_budget_usd", "%.2f USD is more than the server's maximum of %.2f USD per task", budget, s.budgets.MaxBudgetUSD)
	}
	if req.GetDispatch() && s.dispatcher == nil {
		return nil, status.Error(codes.FailedPrecondition, "dispatch: no DispatchService is configured")
	}
	// Refuse before spending: nothing is stored for a repository or branch
	// the task could never clone.
	if err := s.checkRepo(ctx, n.Repo, n.BaseBranch); err != nil {
		return nil, err
	}
	ctx, span := tracer.Start(ctx, "task.create", trace.WithAttributes(attribute.String("taskrunner.repo", n.Repo),
		attribute.String("taskrunner.agent", string(n.Agent))))
	defer span.End()
	t, created, err := s.store.Create(ctx, n, telemetry.Traceparent(ctx))
	if err != nil {
		span.RecordError(err)
		return nil, err
	}
	span.SetAttributes(attribute.String("taskrunner.task_id", t.ID))
	if created && budget > 0 {
		if err := s.store.SetBudget(ctx, t.ID, budget); err != nil {
			if _, derr := s.store.DeleteUnstarted(context.WithoutCancel(ctx), t.ID); derr != nil {
				s.log.ErrorContext(ctx, "could not remove a task whose budget was not recorded", "task_id", t.ID, "error", derr)
			}
			return nil, err
		}
	}
	if created {
		s.log.InfoContext(ctx, "task created", "task_id", t.ID, "owner", t.Owner, "repo", t.Repo)
	}
	if req.GetDispatch() && created {
		d, err := s.dispatcher.DispatchTask(ctx, t.ID)
		if err != nil {
			// A refused create stores nothing and leaves the key unused:
			// the caller may send the same request again later.
			if _, derr := s.store.DeleteUnstarted(context.WithoutCancel(ctx), t.ID); derr != nil {
				s.log.ErrorContext(ctx, "could not remove a task whose dispatch was refused", "task_id", t.ID, "error", derr)
			}
			return nil, err
		}
		t = d
	}
	return &taskrunnerv1.CreateTaskResponse{Task: s.toProto(ctx, t)}, nil
}

// idempotencyKey is the request_id field, or else the REST Idempotency-Key
// header that the gateway forwards as metadata.
func idempotencyKey(ctx context.Context, field string) string {
	if field != "" {
		return field
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("idempotency-key"); len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// GetTask implements TaskService.
func (s *Server) GetTask(ctx context.Context, req *taskrunnerv1.GetTaskRequest) (*taskrunnerv1.GetTaskResponse, error) {
	owner, err := s.ownerFor(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	var full bool
	switch v := req.GetView(); v {
	case taskrunnerv1.TaskView_TASK_VIEW_UNSPECIFIED, taskrunnerv1.TaskView_TASK_VIEW_FULL:
		full = true
	case taskrunnerv1.TaskView_TASK_VIEW_BASIC:
	default:
		return nil, errs.Invalid("view", "unknown task view %d", v)
	}
	t, budget, err := s.store.Shown(ctx, req.GetId(), owner, full)
	if err != nil {
		return nil, err
	}
	out := ToProto(t)
	out.MaxBudgetUsd = EffectiveBudget(budget, s.budgets.MaxBudgetUSD)
	if full && s.budgets.OwnerDailyUSD > 0 {
		spent, resets, err := s.store.OwnerSpentToday(ctx, t.Owner)
		if err != nil {
			return nil, err
		}
		out.OwnerQuota = &taskrunnerv1.OwnerQuota{DailyUsd: s.budgets.OwnerDailyUSD, SpentTodayUsd: spent, ResetsTime: timestamppb.New(resets)}
	}
	return &taskrunnerv1.GetTaskResponse{Task: out}, nil
}

// toProto is ToProto with the task's effective budget filled in.
func (s *Server) toProto(ctx context.Context, t Task) *taskrunnerv1.Task {
	return s.withBudgets(ctx, ToProto(t))[0]
}

// withBudgets fills max_budget_usd (the budget set at create bounded by the
// server's maximum) in one query. Should the query fail, the server's
// maximum is shown and the failure logged: the answer stays useful and the
// model proxy, which enforces the budget, reads the column itself.
func (s *Server) withBudgets(ctx context.Context, ts ...*taskrunnerv1.Task) []*taskrunnerv1.Task {
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.GetId()
	}
	set, err := s.store.Budgets(ctx, ids...)
	if err != nil {
		s.log.WarnContext(ctx, "could not read task budgets", "error", err)
	}
	for _, t := range ts {
		t.MaxBudgetUsd = EffectiveBudget(set[t.GetId()], s.budgets.MaxBudgetUSD)
	}
	return ts
}

// FollowUpTask implements TaskService: it records the follow-up as a
// pending run and asks Dispatch to start it (now, or once the active run
// ends). Internal callers (the webhook) may name the trigger and who asked.
func (s *Server) FollowUpTask(ctx context.Context, req *taskrunnerv1.FollowUpTaskRequest) (*taskrunnerv1.FollowUpTaskResponse, error) {
	p, err := auth.Require(ctx)
	if err != nil {
		return nil, err
	}
	t, err := s.owned(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	prompt := strings.TrimSpace(req.GetPrompt())
	switch {
	case prompt == "":
		return nil, errs.Invalid("prompt", "is required: say what the follow-up should change")
	case len(prompt) > MaxPromptBytes:
		return nil, errs.Invalid("prompt", "is %d bytes, more than the limit of %d", len(prompt), MaxPromptBytes)
	}
	f := FollowUp{Prompt: prompt, RequestID: idempotencyKey(ctx, req.GetRequestId()), Trigger: "api", RequestedBy: string(UserActor(t.Owner))}
	if len(f.RequestID) > MaxRequestIDBytes {
		return nil, errs.Invalid("request_id", "is longer than %d bytes", MaxRequestIDBytes)
	}
	if p.Has(auth.ScopeInternal) {
		switch req.GetTrigger() {
		case "", "api":
		case "review", "comment":
			f.Trigger = req.GetTrigger()
		default:
			return nil, errs.Invalid("trigger", "want api, review or comment, got %q", truncate(req.GetTrigger(), 40))
		}
		if by := req.GetRequestedBy(); by != "" {
			f.RequestedBy = by
		}
	}
	if s.dispatcher == nil {
		return nil, status.Error(codes.FailedPrecondition, "follow-up: no DispatchService is configured")
	}
	ctx, span := StartSpan(ctx, t, "task.followup")
	defer span.End()
	t, number, created, err := s.store.AddFollowUp(ctx, t.ID, "", f, s.maxRuns)
	if err != nil {
		return nil, err
	}
	if created {
		s.log.InfoContext(ctx, "follow-up recorded", "task_id", t.ID, "run", number, "trigger", f.Trigger)
		if _, err := s.dispatcher.StartFollowUp(ctx, t.ID); err != nil {
			// The run stays pending (Dispatch retries when capacity frees)
			// unless the refusal is the owner's: then nothing is kept.
			if errors.Is(err, errs.ErrQuotaExceeded) {
				if derr := s.store.DropPendingRun(context.WithoutCancel(ctx), t.ID, number); derr != nil {
					s.log.ErrorContext(ctx, "could not drop a refused follow-up", "task_id", t.ID, "error", derr)
				}
			}
			return nil, err
		}
	}
	t, err = s.store.Get(ctx, t.ID, "")
	if err != nil {
		return nil, err
	}
	if err := s.store.Runs(ctx, &t); err != nil {
		return nil, err
	}
	out := &taskrunnerv1.FollowUpTaskResponse{Task: s.toProto(ctx, t), Created: created}
	for _, r := range out.Task.GetRuns() {
		if r.GetNumber() == number {
			out.Run = r
		}
	}
	return out, nil
}

// owned loads the caller's task; other owners' tasks are NotFound. Internal
// callers (the gateway's webhook, other services) may read any task.
func (s *Server) owned(ctx context.Context, id string) (Task, error) {
	owner, err := s.ownerFor(ctx, id)
	if err != nil {
		return Task{}, err
	}
	return s.store.Get(ctx, id, owner)
}

// ownerFor is the owner whose task id the caller may read ("" for an
// internal caller: any), after checking the caller's scope and the id.
func (s *Server) ownerFor(ctx context.Context, id string) (string, error) {
	p, err := auth.Require(ctx)
	if err != nil {
		return "", err
	}
	owner := p.Owner
	switch {
	case p.Has(auth.ScopeInternal):
		owner = ""
	case !p.Has(auth.ScopeTasks):
		return "", errs.PermissionDenied("token lacks scope " + auth.ScopeTasks)
	}
	if err := ValidateID("id", id); err != nil {
		return "", err
	}
	return owner, nil
}

// ListTasks implements TaskService.
func (s *Server) ListTasks(ctx context.Context, req *taskrunnerv1.ListTasksRequest) (*taskrunnerv1.ListTasksResponse, error) {
	p, err := auth.RequireScope(ctx, auth.ScopeTasks)
	if err != nil {
		return nil, err
	}
	var f Filter
	if v := req.GetStatus(); v != "" {
		st, ok := ParseStatus(v)
		if !ok {
			return nil, errs.Invalid("status", "unknown status %q (want one of proposing, queued, running, awaiting_review, done, failed, cancelled)", truncate(v, 40))
		}
		f.Status = st
	}
	if r := req.GetRepo(); r != "" {
		if err := ValidateRepo("repo", r); err != nil {
			return nil, err
		}
		f.Repo = r
	}
	size := int(req.GetPageSize())
	switch {
	case size < 0 || size > maxPageSize:
		return nil, errs.Invalid("page_size", "must be between 1 and %d", maxPageSize)
	case size == 0:
		size = defaultPageSize
	}
	tasks, next, err := s.store.List(ctx, p.Owner, f, size, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	out := &taskrunnerv1.ListTasksResponse{NextPageToken: next}
	for _, t := range tasks {
		out.Tasks = append(out.Tasks, ToProto(t))
	}
	s.withBudgets(ctx, out.Tasks...)
	return out, nil
}

// DispatchTask implements TaskService by delegating to DispatchService.
func (s *Server) DispatchTask(ctx context.Context, req *taskrunnerv1.DispatchTaskRequest) (*taskrunnerv1.DispatchTaskResponse, error) {
	t, err := s.owned(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	if s.dispatcher == nil {
		return nil, status.Error(codes.Unimplemented, "dispatch: no DispatchService is configured")
	}
	// Refuse before spending quota or a sandbox start. Only a task that has
	// not been dispatched yet can spend; Dispatch answers the others.
	if t.Status == StatusProposing {
		if err := s.checkRepo(ctx, t.Repo, t.BaseBranch); err != nil {
			return nil, err
		}
	}
	t, err = s.dispatcher.DispatchTask(ctx, t.ID)
	if err != nil {
		return nil, err
	}
	return &taskrunnerv1.DispatchTaskResponse{Task: s.toProto(ctx, t)}, nil
}

// CancelTask implements TaskService. A task that never ran is cancelled here;
// a running one (whose sandbox must stop) or one awaiting review (whose pull
// request is closed with a comment naming who cancelled) is handed to
// DispatchService. The cancel joins the task's trace.
func (s *Server) CancelTask(ctx context.Context, req *taskrunnerv1.CancelTaskRequest) (*taskrunnerv1.CancelTaskResponse, error) {
	p, err := auth.Require(ctx)
	if err != nil {
		return nil, err
	}
	t, err := s.owned(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	who := p.Owner
	if who == "" {
		who = t.Owner
	}
	actor := UserActor(who)
	reason := strings.TrimSpace(req.GetReason())
	if reason == "" {
		reason = "cancelled by " + who
	}
	ctx, span := StartSpan(ctx, t, "task.cancel")
	defer span.End()
	switch {
	case (t.Status == StatusRunning || t.Status == StatusAwaitingReview) && s.dispatcher != nil:
		t, err = s.dispatcher.CancelTask(ctx, t.ID, reason, actor)
	case t.Status == StatusRunning:
		return nil, status.Error(codes.Unimplemented, "cancel: the task is running and no DispatchService is configured")
	default:
		t, _, err = s.store.Advance(ctx, t.ID, "", Advance{Status: StatusCancelled, FailedReason: reason, Actor: actor})
	}
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "task cancelled", "task_id", t.ID, "actor", actor)
	return &taskrunnerv1.CancelTaskResponse{Task: s.toProto(ctx, t)}, nil
}

// RetryTask implements TaskService: a new task, linked to the old one.
func (s *Server) RetryTask(ctx context.Context, req *taskrunnerv1.RetryTaskRequest) (*taskrunnerv1.RetryTaskResponse, error) {
	old, err := s.owned(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	if old.Status != StatusFailed && old.Status != StatusCancelled {
		return nil, errs.Transition("task %s is %s: only failed or cancelled tasks can be retried", old.ID, old.Status)
	}
	n := NewTask{Owner: old.Owner, Repo: old.Repo, BaseBranch: old.BaseBranch, Prompt: old.Prompt, Agent: old.Agent,
		IdempotencyKey: idempotencyKey(ctx, req.GetRequestId()), RetryOf: old.ID}
	if err := n.Validate(); err != nil {
		return nil, err
	}
	if err := s.checkRepo(ctx, n.Repo, n.BaseBranch); err != nil {
		return nil, err
	}
	ctx, span := tracer.Start(ctx, "task.create", trace.WithAttributes(attribute.String("taskrunner.repo", n.Repo),
		attribute.String("taskrunner.retry_of", old.ID)))
	defer span.End()
	t, created, err := s.store.Create(ctx, n, telemetry.Traceparent(ctx))
	if err != nil {
		return nil, err
	}
	span.SetAttributes(attribute.String("taskrunner.task_id", t.ID))
	if created {
		// The retry keeps the budget the old task was created with.
		if b, err := s.store.Budget(ctx, old.ID); err != nil || b > 0 {
			if err == nil {
				err = s.store.SetBudget(ctx, t.ID, b)
			}
			if err != nil {
				if _, derr := s.store.DeleteUnstarted(context.WithoutCancel(ctx), t.ID); derr != nil {
					s.log.ErrorContext(ctx, "could not remove a retry whose budget was not recorded", "task_id", t.ID, "error", derr)
				}
				return nil, err
			}
		}
	}
	return &taskrunnerv1.RetryTaskResponse{Task: s.toProto(ctx, t)}, nil
}

// AdvanceTask implements the internal transition RPC.
func (s *Server) AdvanceTask(ctx context.Context, req *taskrunnerv1.AdvanceTaskRequest) (*taskrunnerv1.AdvanceTaskResponse, error) {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return nil, err
	}
	if err := ValidateID("task_id", req.GetTaskId()); err != nil {
		return nil, err
	}
	a, err := AdvanceFromProto(req)
	if err != nil {
		return nil, err
	}
	if a.Status != "" {
		// A decision from outside (the webhook's merge or close) joins the
		// task's trace.
		if cur, err := s.store.Get(ctx, req.GetTaskId(), req.GetOwner()); err == nil {
			var span trace.Span
			ctx, span = StartSpan(ctx, cur, "task.advance")
			span.SetAttributes(attribute.String("taskrunner.status", string(a.Status)), attribute.String("taskrunner.actor", string(a.Actor)))
			defer span.End()
		}
	}
	t, applied, err := s.store.Advance(ctx, req.GetTaskId(), req.GetOwner(), a)
	if err != nil {
		return nil, err
	}
	if applied {
		t, _ = s.store.Get(ctx, t.ID, "")
	}
	return &taskrunnerv1.AdvanceTaskResponse{Task: ToProto(t), Applied: applied}, nil
}

// AdvanceFromProto converts and checks an AdvanceTaskRequest.
func AdvanceFromProto(req *taskrunnerv1.AdvanceTaskRequest) (Advance, error) {
	if req.GetSeq() < 0 {
		return Advance{}, errs.Invalid("seq", "must not be negative")
	}
	a := Advance{Seq: req.GetSeq(), RequestID: req.GetRequestId(), PRURL: req.GetPrUrl(), PRNumber: req.GetPrNumber(),
		FailedReason: req.GetFailedReason(), Heartbeat: req.GetHeartbeat(), Actor: Actor(req.GetActor()), Reason: req.GetReason()}
	if req.GetStatus() != taskrunnerv1.TaskStatus_TASK_STATUS_UNSPECIFIED {
		st, ok := statusFromProto[req.GetStatus()]
		if !ok {
			return a, errs.Invalid("status", "unknown status %d", req.GetStatus())
		}
		a.Status = st
	}
	if req.GetStage() != taskrunnerv1.TaskStage_TASK_STAGE_UNSPECIFIED {
		sg, ok := stageFromProto[req.GetStage()]
		if !ok {
			return a, errs.Invalid("stage", "unknown stage %d", req.GetStage())
		}
		a.Stage = sg
	}
	if d := req.GetDiffStats(); d != nil {
		a.Diff = &DiffStats{Additions: d.GetAdditions(), Deletions: d.GetDeletions(), FilesChanged: d.GetFilesChanged()}
	}
	if u := req.GetUsage(); u != nil {
		a.Usage = &Usage{CostUSD: u.GetCostUsd(), TokensIn: u.GetTokensIn(), TokensOut: u.GetTokensOut()}
	}
	return a, nil
}

var (
	statusToProto = map[Status]taskrunnerv1.TaskStatus{
		StatusProposing:      taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING,
		StatusQueued:         taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED,
		StatusRunning:        taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING,
		StatusAwaitingReview: taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW,
		StatusDone:           taskrunnerv1.TaskStatus_TASK_STATUS_DONE,
		StatusFailed:         taskrunnerv1.TaskStatus_TASK_STATUS_FAILED,
		StatusCancelled:      taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED,
	}
	statusFromProto = invert(statusToProto)
	stageToProto    = map[Stage]taskrunnerv1.TaskStage{
		StageNone:    taskrunnerv1.TaskStage_TASK_STAGE_UNSPECIFIED,
		StageExplore: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE,
		StagePropose: taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE,
		StageApply:   taskrunnerv1.TaskStage_TASK_STAGE_APPLY,
		StageArchive: taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE,
	}
	stageFromProto = invert(stageToProto)
	agentToProto   = map[Agent]taskrunnerv1.Agent{AgentClaude: taskrunnerv1.Agent_AGENT_CLAUDE, AgentCodex: taskrunnerv1.Agent_AGENT_CODEX}
)

func invert[K, V comparable](m map[K]V) map[V]K {
	out := make(map[V]K, len(m))
	for k, v := range m {
		out[v] = k
	}
	return out
}

// StatusToProto converts a status.
func StatusToProto(s Status) taskrunnerv1.TaskStatus { return statusToProto[s] }

// StageToProto converts a stage.
func StageToProto(s Stage) taskrunnerv1.TaskStage { return stageToProto[s] }

// StageFromProto converts a stage; ok is false for unknown values.
func StageFromProto(s taskrunnerv1.TaskStage) (Stage, bool) {
	v, ok := stageFromProto[s]
	return v, ok
}

// ToProto converts a stored task to its wire form.
func ToProto(t Task) *taskrunnerv1.Task {
	out := &taskrunnerv1.Task{
		Id: t.ID, Owner: t.Owner, Repo: t.Repo, BaseBranch: t.BaseBranch, HeadBranch: t.HeadBranch, Prompt: t.Prompt,
		Agent: agentToProto[t.Agent], Status: statusToProto[t.Status], Stage: stageToProto[t.Stage],
		DiffStats: &taskrunnerv1.DiffStats{Additions: t.Diff.Additions, Deletions: t.Diff.Deletions, FilesChanged: t.Diff.FilesChanged},
		Usage:     &taskrunnerv1.Usage{CostUsd: t.Usage.CostUSD, TokensIn: t.Usage.TokensIn, TokensOut: t.Usage.TokensOut},
		PrUrl:     t.PRURL, PrNumber: t.PRNumber, FailedReason: t.FailedReason, LastSeq: t.LastSeq, TraceId: t.TraceID,
		RetryOf:       t.RetryOf,
		QueuePosition: t.QueuePosition, TimelineSeq: t.TimelineSeq, Run: max(t.Run, 1),
		CreateTime: timestamppb.New(t.CreatedAt),
		UpdateTime: timestamppb.New(t.UpdatedAt),
	}
	if t.DeadlineAt != nil {
		out.DeadlineTime = timestamppb.New(*t.DeadlineAt)
	}
	if t.HeartbeatAt != nil {
		out.HeartbeatTime = timestamppb.New(*t.HeartbeatAt)
	}
	for _, r := range t.Runs {
		out.Runs = append(out.Runs, &taskrunnerv1.TaskRun{Number: r.Number, Trigger: r.Trigger, Prompt: r.Prompt, State: r.State,
			RequestedBy: r.RequestedBy, CreateTime: timestamppb.New(r.CreatedAt),
			DiffStats: &taskrunnerv1.DiffStats{Additions: r.Diff.Additions, Deletions: r.Diff.Deletions, FilesChanged: r.Diff.FilesChanged},
			Usage:     &taskrunnerv1.Usage{CostUsd: r.Usage.CostUSD, TokensIn: r.Usage.TokensIn, TokensOut: r.Usage.TokensOut}})
	}
	return out
}

// FromProto converts a wire task back (for callers of a remote TaskService
// or DispatchService).
func FromProto(p *taskrunnerv1.Task) Task {
	t := Task{ID: p.GetId(), Owner: p.GetOwner(), Repo: p.GetRepo(), BaseBranch: p.GetBaseBranch(), HeadBranch: p.GetHeadBranch(),
		Prompt: p.GetPrompt(), Status: statusFromProto[p.GetStatus()], Stage: stageFromProto[p.GetStage()],
		Diff:  DiffStats{p.GetDiffStats().GetAdditions(), p.GetDiffStats().GetDeletions(), p.GetDiffStats().GetFilesChanged()},
		Usage: Usage{p.GetUsage().GetCostUsd(), p.GetUsage().GetTokensIn(), p.GetUsage().GetTokensOut()},
		PRURL: p.GetPrUrl(), PRNumber: p.GetPrNumber(), FailedReason: p.GetFailedReason(), LastSeq: p.GetLastSeq(),
		TraceID: p.GetTraceId(), RetryOf: p.GetRetryOf(), QueuePosition: p.GetQueuePosition(), TimelineSeq: p.GetTimelineSeq(),
		CreatedAt: p.GetCreateTime().AsTime(), UpdatedAt: p.GetUpdateTime().AsTime()}
	for a, v := range agentToProto {
		if v == p.GetAgent() {
			t.Agent = a
		}
	}
	if p.GetDeadlineTime() != nil {
		d := p.GetDeadlineTime().AsTime()
		t.DeadlineAt = &d
	}
	if p.GetHeartbeatTime() != nil {
		h := p.GetHeartbeatTime().AsTime()
		t.HeartbeatAt = &h
	}
	return t
}
