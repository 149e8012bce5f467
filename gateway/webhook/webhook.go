package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-github/v62/github"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Path is where the gateway mounts the handler (method POST).
const Path = "/v1/webhooks/github"

// Defaults.
const (
	DefaultMaxBodyBytes = 1 << 20
	DefaultTimeout      = 10 * time.Second
	// DefaultMention is the handle a conversation comment must mention to ask for a follow-up.
	DefaultMention = "@taskrunner"
	// headBranchPrefix is task.HeadBranch's prefix; the gateway does not import the service.
	headBranchPrefix = "taskrunner/"
	// requestIDPrefix namespaces delivery ids among the task's other request ids.
	requestIDPrefix = "github-delivery:"
	maxDeliveryID   = 128
	// errorDomain is the ErrorInfo domain of the API's errors (services/errs.Domain).
	errorDomain = "taskrunner.dev"
)

// Tasks is the part of TaskService the receiver calls. A taskrunnerv1.TaskServiceClient on a
// connection that sends an internal-scope bearer token satisfies it; GetTask must then return
// a task of any owner to that caller.
type Tasks interface {
	GetTask(ctx context.Context, in *taskrunnerv1.GetTaskRequest, opts ...grpc.CallOption) (*taskrunnerv1.GetTaskResponse, error)
	AdvanceTask(ctx context.Context, in *taskrunnerv1.AdvanceTaskRequest, opts ...grpc.CallOption) (*taskrunnerv1.AdvanceTaskResponse, error)
}

// Config configures the receiver.
type Config struct {
	// Secret is the webhook secret configured on the GitHub App (or repository hook).
	Secret string `env:"TASKRUNNER_GITHUB_WEBHOOK_SECRET"`
	// MaxBodyBytes bounds a delivery; larger ones get 413. Default 1 MiB.
	MaxBodyBytes int64 `env:"TASKRUNNER_GITHUB_WEBHOOK_MAX_BODY_BYTES" envDefault:"1048576"`
	// Timeout bounds the TaskService calls of one delivery. Default 10s.
	Timeout time.Duration `env:"TASKRUNNER_GITHUB_WEBHOOK_TIMEOUT" envDefault:"10s"`
	// Mention is the handle a comment on a pull request's conversation must mention to ask for
	// a follow-up run. Default "@taskrunner".
	Mention string `env:"TASKRUNNER_GITHUB_MENTION" envDefault:"@taskrunner"`
}

var mentionPattern = regexp.MustCompile(`^@[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$`)

// Validate names the offending variable; it never prints the secret.
func (c Config) Validate() error {
	var errs []error
	if len(c.Secret) < 16 {
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_WEBHOOK_SECRET: required, at least 16 characters"))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_WEBHOOK_MAX_BODY_BYTES: must not be negative"))
	}
	if c.Timeout < 0 {
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_WEBHOOK_TIMEOUT: must not be negative"))
	}
	if c.Mention != "" && !mentionPattern.MatchString(c.Mention) {
		errs = append(errs, fmt.Errorf("TASKRUNNER_GITHUB_MENTION: %q is not @ followed by a GitHub login", c.Mention))
	}
	return errors.Join(errs...)
}

// Handler is the webhook receiver.
//
// Status codes: 401 bad or missing signature (checked before anything else; only
// X-Hub-Signature-256 counts); 400 malformed JSON or missing headers; 405 not POST; 413 body
// over the limit; 415 a Content-Type GitHub does not send; 200 a transition was applied, a
// follow-up was requested, or the delivery was a repeat; 202 acknowledged and ignored (other
// events and actions, branches that are not taskrunner's, an unknown task, a repository that
// is not the task's, a task not awaiting review, a transition TaskService refuses, a comment
// whose author may not ask for a follow-up, follow-ups not enabled); 204 for ping; 503 when
// TaskService (or GitHub, for a follow-up) is unreachable, so the delivery can be redelivered.
// An unknown task is 202, not 404: GitHub shows 4xx deliveries as failures, and there is
// nothing to retry.
//
// Answers of 2xx are {result, detail, task_id, status}; errors are the API's error shape
// {code, message, details} with an ErrorInfo reason.
type Handler struct {
	cfg    Config
	secret []byte
	tasks  Tasks
	log    *slog.Logger
	follow FollowUpDeps
}

var _ http.Handler = (*Handler)(nil)

// Option adds an optional dependency.
type Option func(*Handler)

// WithFollowUps lets review and comment events start follow-up runs (see FollowUpDeps).
// Without it they are verified, parsed, logged and acknowledged with 202.
func WithFollowUps(d FollowUpDeps) Option {
	return func(h *Handler) { h.follow = d }
}

// New returns the receiver.
func New(cfg Config, tasks Tasks, logger *slog.Logger, opts ...Option) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if tasks == nil {
		return nil, errors.New("webhook: tasks is required")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Mention == "" {
		cfg.Mention = DefaultMention
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, secret: []byte(cfg.Secret), tasks: tasks, log: logger}
	for _, o := range opts {
		o(h)
	}
	if err := h.follow.validate(); err != nil {
		return nil, err
	}
	return h, nil
}

var taskIDPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// reply is the body of a 2xx answer.
type reply struct {
	Result string `json:"result"`
	Detail string `json:"detail,omitempty"`
	TaskID string `json:"task_id,omitempty"`
	Status string `json:"status,omitempty"`
}

// answer is what one delivery gets: a reply, or an error in the API's shape.
type answer struct {
	code int
	rep  reply
	err  *status.Status
}

func ok(code int, r reply) answer { return answer{code: code, rep: r} }

func ignored(detail, taskID string) answer {
	return ok(http.StatusAccepted, reply{Result: "ignored", Detail: detail, TaskID: taskID})
}

// fail is an error answer: HTTP status, gRPC code, ErrorInfo reason and message; taskID, when
// known, goes into the ErrorInfo metadata.
func fail(httpCode int, c codes.Code, reason, msg, taskID string) answer {
	info := &errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}
	if taskID != "" {
		info.Metadata = map[string]string{"task_id": taskID}
	}
	st := status.New(c, msg)
	if withInfo, err := st.WithDetails(info); err == nil {
		st = withInfo
	}
	return answer{code: httpCode, err: st}
}

func (a answer) write(w http.ResponseWriter) {
	if a.code == http.StatusNoContent {
		w.WriteHeader(a.code)
		return
	}
	var body []byte
	if a.err != nil {
		body, _ = protojson.Marshal(a.err.Proto())
	} else {
		body, _ = json.Marshal(a.rep)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.code)
	_, _ = w.Write(body)
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(http.StatusMethodNotAllowed, codes.Unimplemented, "METHOD_NOT_ALLOWED", "use POST", "").write(w)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes)
	h.serve(r).write(w)
}

// verifiedDelivery is a verified delivery: its headers and its JSON payload.
type verifiedDelivery struct {
	event, id string
	payload   []byte
	log       *slog.Logger
}

func (h *Handler) serve(r *http.Request) answer {
	ctx := r.Context()
	d, a, verified := h.verify(r)
	if !verified {
		return a
	}
	switch d.event {
	case "":
		return fail(http.StatusBadRequest, codes.InvalidArgument, "MISSING_EVENT", "missing X-GitHub-Event", "")
	case "ping":
		return ok(http.StatusNoContent, reply{})
	case "pull_request", "pull_request_review", "pull_request_review_comment", "issue_comment":
	default:
		return ignored("event "+d.event+" is not handled", "")
	}
	ev, err := github.ParseWebHook(d.event, d.payload)
	if err != nil {
		return fail(http.StatusBadRequest, codes.InvalidArgument, "BAD_PAYLOAD", "not a "+d.event+" payload", "")
	}
	switch ev := ev.(type) {
	case *github.PullRequestEvent:
		return h.pullRequest(ctx, d, ev)
	case *github.PullRequestReviewEvent:
		return h.review(ctx, d, ev)
	case *github.PullRequestReviewCommentEvent:
		return h.reviewComment(ctx, d, ev)
	case *github.IssueCommentEvent:
		return h.issueComment(ctx, d, ev)
	}
	return ignored("event "+d.event+" is not handled", "")
}

// verify reads the body within the limit and checks the signature with go-github, before
// anything else is looked at; then it extracts the JSON payload (GitHub sends it as the body,
// or as the "payload" form field for application/x-www-form-urlencoded hooks).
func (h *Handler) verify(r *http.Request) (verifiedDelivery, answer, bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return verifiedDelivery{}, fail(http.StatusRequestEntityTooLarge, codes.InvalidArgument, "BODY_TOO_LARGE", fmt.Sprintf("body over %d bytes", h.cfg.MaxBodyBytes), ""), false
		}
		return verifiedDelivery{}, fail(http.StatusBadRequest, codes.InvalidArgument, "UNREADABLE_BODY", "could not read body", ""), false
	}
	d := verifiedDelivery{event: r.Header.Get("X-GitHub-Event"), id: r.Header.Get("X-GitHub-Delivery")}
	d.log = h.log.With("event", d.event, "delivery", d.id)
	sig := r.Header.Get("X-Hub-Signature-256")
	// go-github would also accept "sha1=" here; only SHA-256 signatures count.
	if !strings.HasPrefix(sig, "sha256=") || github.ValidateSignature(sig, body, h.secret) != nil {
		d.log.WarnContext(r.Context(), "webhook refused: bad or missing signature", "remote", r.RemoteAddr)
		return d, fail(http.StatusUnauthorized, codes.Unauthenticated, "BAD_SIGNATURE", "bad or missing X-Hub-Signature-256", ""), false
	}
	mediaType := "application/json" // what GitHub sends unless the hook is form-encoded
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mediaType, _, err = mime.ParseMediaType(ct); err != nil {
			mediaType = ct
		}
	}
	d.payload, err = github.ValidatePayloadFromBody(mediaType, bytes.NewReader(body), sig, h.secret)
	if err != nil {
		return d, fail(http.StatusUnsupportedMediaType, codes.InvalidArgument, "UNSUPPORTED_CONTENT_TYPE", "Content-Type must be application/json or application/x-www-form-urlencoded", ""), false
	}
	if !json.Valid(d.payload) {
		return d, fail(http.StatusBadRequest, codes.InvalidArgument, "BAD_PAYLOAD", "body is not JSON", ""), false
	}
	return d, answer{}, true
}

// checkDelivery refuses a delivery id that cannot serve as an idempotency key.
func checkDelivery(d verifiedDelivery) (answer, bool) {
	if d.id == "" || len(d.id) > maxDeliveryID {
		return fail(http.StatusBadRequest, codes.InvalidArgument, "BAD_DELIVERY_ID", "missing or overlong X-GitHub-Delivery", ""), false
	}
	return answer{}, true
}

// pullRequest handles pull_request: a closed pull request of a taskrunner branch finishes its
// task.
func (h *Handler) pullRequest(ctx context.Context, d verifiedDelivery, ev *github.PullRequestEvent) answer {
	if ev.PullRequest == nil || ev.Repo == nil {
		return fail(http.StatusBadRequest, codes.InvalidArgument, "BAD_PAYLOAD", "not a pull_request payload", "")
	}
	if ev.GetAction() != "closed" {
		return ignored("action "+ev.GetAction()+" is not handled", "")
	}
	if a, valid := checkDelivery(d); !valid {
		return a
	}
	pr := ev.PullRequest
	number := int64(pr.GetNumber())
	if number == 0 {
		number = int64(ev.GetNumber())
	}
	id, lg, a, found := h.taskOf(ctx, d, ev.Repo, pr.GetHead(), number)
	if !found {
		return a
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	t, a, found := h.taskFor(ctx, lg, id, ev.Repo.GetFullName(), number)
	if !found {
		return a
	}
	// Only a task awaiting review is moved. Closing the PR of a task that is still running
	// must go through CancelTask (which stops the sandbox), not through here. Terminal tasks
	// go to TaskService anyway, so a repeated delivery is reported as such.
	switch t.GetStatus() {
	case taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING:
		lg.InfoContext(ctx, "webhook ignored: task is not awaiting review", "status", t.GetStatus().String())
		return ok(http.StatusAccepted, reply{Result: "ignored", Detail: "task is not awaiting review", TaskID: id, Status: t.GetStatus().String()})
	}
	req := &taskrunnerv1.AdvanceTaskRequest{TaskId: id, RequestId: requestIDPrefix + d.id, Actor: "github"}
	if pr.GetMerged() {
		req.Status = taskrunnerv1.TaskStatus_TASK_STATUS_DONE
		req.Reason = fmt.Sprintf("pull request #%d merged", number)
		if by := pr.GetMergedBy().GetLogin(); by != "" {
			req.Reason += " by " + by
		}
	} else {
		req.Status = taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED
		req.FailedReason = fmt.Sprintf("pull request #%d closed without merge", number)
	}
	resp, err := h.tasks.AdvanceTask(ctx, req)
	if err != nil {
		return h.taskError(ctx, lg, "advance task", id, err)
	}
	st := resp.GetTask().GetStatus().String()
	if !resp.GetApplied() {
		lg.InfoContext(ctx, "webhook repeated: nothing changed", "status", st)
		return ok(http.StatusOK, reply{Result: "duplicate", TaskID: id, Status: st})
	}
	lg.InfoContext(ctx, "webhook applied", "status", st, "merged", pr.GetMerged())
	return ok(http.StatusOK, reply{Result: "applied", TaskID: id, Status: st})
}

// taskOf finds the task a pull request's head branch names. A fork can name its branch
// taskrunner/<id> too; only a branch of the repository itself is ours.
func (h *Handler) taskOf(ctx context.Context, d verifiedDelivery, repo *github.Repository, head *github.PullRequestBranch, number int64) (string, *slog.Logger, answer, bool) {
	id, isOurs := strings.CutPrefix(head.GetRef(), headBranchPrefix)
	if !isOurs || !taskIDPattern.MatchString(id) {
		return "", nil, ignored("not a taskrunner branch", ""), false
	}
	full := repo.GetFullName()
	lg := d.log.With("task_id", id, "repo", full, "pr_number", number)
	if head.Repo != nil && !strings.EqualFold(head.Repo.GetFullName(), full) {
		lg.WarnContext(ctx, "webhook ignored: head branch is in another repository", "head_repo", head.Repo.GetFullName())
		return "", nil, ignored("head branch is not in the repository", id), false
	}
	return id, lg, answer{}, true
}

// taskFor loads the task and checks that the pull request is its own.
func (h *Handler) taskFor(ctx context.Context, lg *slog.Logger, id, repo string, number int64) (*taskrunnerv1.Task, answer, bool) {
	got, err := h.tasks.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id})
	if err != nil {
		return nil, h.taskError(ctx, lg, "get task", id, err), false
	}
	t := got.GetTask()
	if !strings.EqualFold(t.GetRepo(), repo) {
		lg.WarnContext(ctx, "webhook ignored: repository is not the task's", "task_repo", t.GetRepo())
		return nil, ignored("repository does not match the task", id), false
	}
	if t.GetPrNumber() != 0 && t.GetPrNumber() != number {
		lg.WarnContext(ctx, "webhook ignored: pull request is not the task's", "task_pr_number", t.GetPrNumber())
		return nil, ignored("pull request does not match the task", id), false
	}
	return t, answer{}, true
}

// taskError turns a TaskService (or follow-up) error into the delivery's answer.
func (h *Handler) taskError(ctx context.Context, lg *slog.Logger, op, id string, err error) answer {
	st := status.Convert(err)
	switch st.Code() {
	case codes.NotFound:
		lg.InfoContext(ctx, "webhook ignored: unknown task")
		return ignored("unknown task", id)
	case codes.FailedPrecondition:
		lg.InfoContext(ctx, "webhook ignored: refused", "op", op, "reason", st.Message())
		what := "transition"
		if op == opFollowUp {
			what = "follow-up"
		}
		return ignored(what+" refused: "+st.Message(), id)
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted, codes.Aborted:
		lg.WarnContext(ctx, "webhook failed: TaskService unavailable", "op", op, "code", st.Code().String(), "error", st.Message())
		return fail(http.StatusServiceUnavailable, codes.Unavailable, "TASK_SERVICE_UNAVAILABLE", "task service unavailable; redeliver later", id)
	}
	lg.ErrorContext(ctx, "webhook failed", "op", op, "code", st.Code().String(), "error", st.Message())
	return fail(http.StatusInternalServerError, codes.Internal, "INTERNAL", "internal error", id)
}
