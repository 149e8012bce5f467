package repotoken

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/rpcretry"
)

// Token is a repository token with where to use it.
type Token struct {
	// Value is the secret. Never log it.
	Value  string
	Expiry time.Time
	// Repo is owner/name.
	Repo string
	// APIBaseURL is the forge's REST API root (https://api.github.com).
	APIBaseURL string
	// GitBaseURL is the root for git over HTTP (https://github.com).
	GitBaseURL string
}

// CloneURL is the repository's git URL (without credentials).
func (t Token) CloneURL() string {
	return strings.TrimRight(t.GitBaseURL, "/") + "/" + t.Repo + ".git"
}

// String hides the secret from fmt.
func (t Token) String() string {
	return fmt.Sprintf("Token{repo=%s expiry=%s}", t.Repo, t.Expiry.Format(time.RFC3339))
}

// Source hands out tokens.
type Source interface {
	Token(ctx context.Context) (Token, error)
}

// ErrAuth marks a refused request for a token.
var ErrAuth = errors.New("authentication failed")

// attemptTimeout bounds one IssueRepoToken call; the server may call GitHub on a cache miss.
const attemptTimeout = 30 * time.Second

// GRPC asks GitHubTokenService.
type GRPC struct {
	client      taskrunnerv1.GitHubTokenServiceClient
	taskID      string
	traceparent string

	// Retry bounds the waits between attempts (zero: rpcretry's defaults, up to 1 s).
	Retry rpcretry.Policy
	// Logger, if set, hears about every retried failure (never a token).
	Logger *slog.Logger
}

// NewGRPC returns a Source over conn (dialled with the task's mTLS credentials and
// rpcretry.DialOption, so grpc-go's reconnects are as quick as the retries).
func NewGRPC(conn grpc.ClientConnInterface, taskID, traceparent string) *GRPC {
	return &GRPC{client: taskrunnerv1.NewGitHubTokenServiceClient(conn), taskID: taskID, traceparent: traceparent}
}

// Token calls IssueRepoToken, retrying every failure but a definite refusal
// (rpcretry.Retryable) until ctx ends: a control-plane restart while a task clones must cost
// the task a second, not the task. Each attempt waits for the connection to be ready and is
// bounded by attemptTimeout. Errors carry the status code and message only.
func (g *GRPC) Token(ctx context.Context) (Token, error) {
	if g.traceparent != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", g.traceparent)
	}
	policy := g.Retry
	if policy.AttemptTimeout == 0 {
		policy.AttemptTimeout = attemptTimeout
	}
	if policy.Notify == nil && g.Logger != nil {
		policy.Notify = func(err error, next time.Duration) {
			st := status.Convert(err)
			g.Logger.Warn("GitHubTokenService.IssueRepoToken failed; retrying", "code", st.Code().String(), "message", st.Message(), "delay", next)
		}
	}
	resp, err := rpcretry.Do(ctx, policy, func(ctx context.Context) (*taskrunnerv1.IssueRepoTokenResponse, error) {
		return g.client.IssueRepoToken(ctx, &taskrunnerv1.IssueRepoTokenRequest{TaskId: g.taskID}, grpc.WaitForReady(true))
	})
	if err != nil {
		st := innerStatus(err)
		switch st.Code() {
		case codes.Unauthenticated, codes.PermissionDenied:
			return Token{}, refusal(st)
		}
		if ctx.Err() != nil {
			return Token{}, fmt.Errorf("GitHubTokenService.IssueRepoToken: %s: %s (gave up: %v)", st.Code(), st.Message(), context.Cause(ctx))
		}
		return Token{}, fmt.Errorf("GitHubTokenService.IssueRepoToken: %s: %s", st.Code(), st.Message())
	}
	if resp.GetToken() == "" {
		return Token{}, errors.New("GitHubTokenService.IssueRepoToken: empty token")
	}
	return Token{
		Value: resp.GetToken(), Expiry: resp.GetExpireTime().AsTime(), Repo: resp.GetRepo(),
		APIBaseURL: resp.GetApiBaseUrl(), GitBaseURL: resp.GetGitBaseUrl(),
	}, nil
}

// ReasonRepoInaccessible is the ErrorInfo reason of GitHubTokenService's answer when the
// certificate was accepted but the GitHub App cannot access the task's repository.
const ReasonRepoInaccessible = "REPO_INACCESSIBLE"

// refusal says what GitHubTokenService answered: that the App cannot access the repository
// (an installation problem, not the sandbox's), or that it refused the task certificate (a
// missing certificate, a finished task, a certificate of another task). The server's own
// message names the cause either way; this only avoids blaming the certificate for GitHub.
func refusal(st *status.Status) error {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == ReasonRepoInaccessible {
			return fmt.Errorf("%w: GitHubTokenService answered that the GitHub App cannot access the repository: %s", ErrAuth, st.Message())
		}
	}
	if st.Code() == codes.Unauthenticated {
		return fmt.Errorf("%w: GitHubTokenService refused the task certificate: %s: %s", ErrAuth, st.Code(), st.Message())
	}
	return fmt.Errorf("%w: GitHubTokenService refused the token: %s: %s", ErrAuth, st.Code(), st.Message())
}

// innerStatus is the gRPC status err carries, with its own message (status.Convert would put
// the whole wrapped text in the message).
func innerStatus(err error) *status.Status {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus()
	}
	return status.Convert(err)
}

// MinValidity is how long a cached token must still be valid to be handed out again.
const MinValidity = 5 * time.Minute

// Cached hands out the last token while it has more than MinValidity left, and asks src again
// otherwise (tokens last an hour; tasks may be longer). OnNew sees every new token, so the
// caller can register it with its redactor.
type Cached struct {
	src   Source
	now   func() time.Time
	onNew func(Token)

	mu  sync.Mutex
	tok Token
}

// NewCached wraps src. now may be nil (time.Now); onNew may be nil.
func NewCached(src Source, now func() time.Time, onNew func(Token)) *Cached {
	if now == nil {
		now = time.Now
	}
	return &Cached{src: src, now: now, onNew: onNew}
}

// Token returns a token valid for at least MinValidity (a token without expiry is kept).
func (c *Cached) Token(ctx context.Context) (Token, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tok.Value != "" && (c.tok.Expiry.IsZero() || c.tok.Expiry.Sub(c.now()) > MinValidity) {
		return c.tok, nil
	}
	t, err := c.src.Token(ctx)
	if err != nil {
		return Token{}, err
	}
	c.tok = t
	if c.onNew != nil {
		c.onNew(t)
	}
	return t, nil
}
