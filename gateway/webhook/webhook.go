package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Path is where the gateway mounts the handler (method POST).
const Path = "/v1/webhooks/github"

// Defaults.
const (
	DefaultMaxBodyBytes = 1 << 20
	DefaultTimeout      = 10 * time.Second
	// headBranchPrefix is task.HeadBranch's prefix; the gateway does not import the service.
	headBranchPrefix = "taskrunner/"
	// requestIDPrefix namespaces delivery ids among the task's other request ids.
	requestIDPrefix = "github-delivery:"
	maxDeliveryID   = 128
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
}

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
	return errors.Join(errs...)
}

// Handler is the webhook receiver.
//
// Status codes: 401 bad or missing signature (checked before anything else); 400 malformed
// JSON or missing headers; 405 not POST; 413 body over the limit; 200 a transition was applied
// or the delivery was a repeat; 202 acknowledged and ignored (other events and actions,
// branches that are not taskrunner's, an unknown task, a repository that is not the task's,
// a task not awaiting review, a transition TaskService refuses); 204 for ping; 503 when
// TaskService is unreachable, so the delivery can be redelivered. An unknown task is 202, not
// 404: GitHub shows 4xx deliveries as failures, and there is nothing to retry.
type Handler struct {
	cfg    Config
	secret []byte
	tasks  Tasks
	log    *slog.Logger
}

var _ http.Handler = (*Handler)(nil)

// New returns the receiver.
func New(cfg Config, tasks Tasks, logger *slog.Logger) (*Handler, error) {
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
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg, secret: []byte(cfg.Secret), tasks: tasks, log: logger}, nil
}

// pullRequestEvent is the part of a pull_request payload the receiver reads.
type pullRequestEvent struct {
	Action      string `json:"action"`
	Number      int64  `json:"number"`
	PullRequest *struct {
		Number int64 `json:"number"`
		Merged bool  `json:"merged"`
		Head   struct {
			Ref  string `json:"ref"`
			Repo *struct {
				FullName string `json:"full_name"`
			} `json:"repo"`
		} `json:"head"`
	} `json:"pull_request"`
	Repository *struct {
		FullName string `json:"full_name"`
	} `json:"repository"`
}

var taskIDPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

type reply struct {
	Result string `json:"result"`
	Detail string `json:"detail,omitempty"`
	TaskID string `json:"task_id,omitempty"`
	Status string `json:"status,omitempty"`
}

func write(w http.ResponseWriter, code int, r reply) {
	if code == http.StatusNoContent {
		w.WriteHeader(code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(r)
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		write(w, http.StatusMethodNotAllowed, reply{Result: "error", Detail: "use POST"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			write(w, http.StatusRequestEntityTooLarge, reply{Result: "error", Detail: fmt.Sprintf("body over %d bytes", h.cfg.MaxBodyBytes)})
			return
		}
		write(w, http.StatusBadRequest, reply{Result: "error", Detail: "could not read body"})
		return
	}
	event := r.Header.Get("X-GitHub-Event")
	delivery := r.Header.Get("X-GitHub-Delivery")
	lg := h.log.With("event", event, "delivery", delivery)
	if !h.validSignature(r.Header.Get("X-Hub-Signature-256"), body) {
		lg.WarnContext(r.Context(), "webhook refused: bad or missing signature", "remote", r.RemoteAddr)
		write(w, http.StatusUnauthorized, reply{Result: "error", Detail: "bad or missing X-Hub-Signature-256"})
		return
	}
	if !json.Valid(body) {
		write(w, http.StatusBadRequest, reply{Result: "error", Detail: "body is not JSON"})
		return
	}
	switch event {
	case "":
		write(w, http.StatusBadRequest, reply{Result: "error", Detail: "missing X-GitHub-Event"})
		return
	case "ping":
		w.WriteHeader(http.StatusNoContent)
		return
	case "pull_request":
	default:
		write(w, http.StatusAccepted, reply{Result: "ignored", Detail: "event " + event + " is not handled"})
		return
	}
	var ev pullRequestEvent
	if err := json.Unmarshal(body, &ev); err != nil || ev.PullRequest == nil || ev.Repository == nil {
		write(w, http.StatusBadRequest, reply{Result: "error", Detail: "not a pull_request payload"})
		return
	}
	if ev.Action != "closed" {
		write(w, http.StatusAccepted, reply{Result: "ignored", Detail: "action " + ev.Action + " is not handled"})
		return
	}
	if delivery == "" || len(delivery) > maxDeliveryID {
		write(w, http.StatusBadRequest, reply{Result: "error", Detail: "missing or overlong X-GitHub-Delivery"})
		return
	}
	code, rep := h.closed(r.Context(), lg, ev, delivery)
	write(w, code, rep)
}

func (h *Handler) validSignature(header string, body []byte) bool {
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok {
		return false
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, h.secret)
	mac.Write(body)
	return hmac.Equal(got, mac.Sum(nil))
}

// closed handles a closed pull request.
func (h *Handler) closed(ctx context.Context, lg *slog.Logger, ev pullRequestEvent, delivery string) (int, reply) {
	pr := ev.PullRequest
	number := pr.Number
	if number == 0 {
		number = ev.Number
	}
	id, ok := strings.CutPrefix(pr.Head.Ref, headBranchPrefix)
	if !ok || !taskIDPattern.MatchString(id) {
		return http.StatusAccepted, reply{Result: "ignored", Detail: "not a taskrunner branch"}
	}
	lg = lg.With("task_id", id, "repo", ev.Repository.FullName, "pr_number", number)
	// A fork can name its branch taskrunner/<id> too; only a branch of the repository itself
	// is ours.
	if pr.Head.Repo != nil && !strings.EqualFold(pr.Head.Repo.FullName, ev.Repository.FullName) {
		lg.WarnContext(ctx, "webhook ignored: head branch is in another repository", "head_repo", pr.Head.Repo.FullName)
		return http.StatusAccepted, reply{Result: "ignored", Detail: "head branch is not in the repository", TaskID: id}
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	got, err := h.tasks.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id})
	if err != nil {
		return h.taskError(ctx, lg, "get task", id, err)
	}
	t := got.GetTask()
	if !strings.EqualFold(t.GetRepo(), ev.Repository.FullName) {
		lg.WarnContext(ctx, "webhook ignored: repository is not the task's", "task_repo", t.GetRepo())
		return http.StatusAccepted, reply{Result: "ignored", Detail: "repository does not match the task", TaskID: id}
	}
	if t.GetPrNumber() != 0 && t.GetPrNumber() != number {
		lg.WarnContext(ctx, "webhook ignored: pull request is not the task's", "task_pr_number", t.GetPrNumber())
		return http.StatusAccepted, reply{Result: "ignored", Detail: "pull request does not match the task", TaskID: id}
	}
	// Only a task awaiting review is moved. Closing the PR of a task that is still running
	// must go through CancelTask (which stops the sandbox), not through here. Terminal tasks
	// go to TaskService anyway, so a repeated delivery is reported as such.
	switch t.GetStatus() {
	case taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING:
		lg.InfoContext(ctx, "webhook ignored: task is not awaiting review", "status", t.GetStatus().String())
		return http.StatusAccepted, reply{Result: "ignored", Detail: "task is not awaiting review", TaskID: id, Status: t.GetStatus().String()}
	}
	req := &taskrunnerv1.AdvanceTaskRequest{TaskId: id, RequestId: requestIDPrefix + delivery}
	if pr.Merged {
		req.Status = taskrunnerv1.TaskStatus_TASK_STATUS_DONE
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
		return http.StatusOK, reply{Result: "duplicate", TaskID: id, Status: st}
	}
	lg.InfoContext(ctx, "webhook applied", "status", st, "merged", pr.Merged)
	return http.StatusOK, reply{Result: "applied", TaskID: id, Status: st}
}

// taskError turns a TaskService error into the delivery's answer.
func (h *Handler) taskError(ctx context.Context, lg *slog.Logger, op, id string, err error) (int, reply) {
	st := status.Convert(err)
	switch st.Code() {
	case codes.NotFound:
		lg.InfoContext(ctx, "webhook ignored: unknown task")
		return http.StatusAccepted, reply{Result: "ignored", Detail: "unknown task", TaskID: id}
	case codes.FailedPrecondition:
		lg.InfoContext(ctx, "webhook ignored: transition refused", "reason", st.Message())
		return http.StatusAccepted, reply{Result: "ignored", Detail: "transition refused: " + st.Message(), TaskID: id}
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted, codes.Aborted:
		lg.WarnContext(ctx, "webhook failed: TaskService unavailable", "op", op, "code", st.Code().String(), "error", st.Message())
		return http.StatusServiceUnavailable, reply{Result: "error", Detail: "task service unavailable; redeliver later", TaskID: id}
	}
	lg.ErrorContext(ctx, "webhook failed", "op", op, "code", st.Code().String(), "error", st.Message())
	return http.StatusInternalServerError, reply{Result: "error", Detail: "internal error", TaskID: id}
}
