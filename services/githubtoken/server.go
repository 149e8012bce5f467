package githubtoken

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/task"
)

// Tasks reads tasks of any owner; *task.Store satisfies it.
type Tasks interface {
	Get(ctx context.Context, id, owner string) (task.Task, error)
}

// Deps are the service's collaborators.
type Deps struct {
	// Tasks looks up the task named by a runner certificate. Required.
	Tasks Tasks
	// Redis caches installation tokens. Required in App mode, unused in personal-token mode.
	Redis redis.UniversalClient
	// HTTPClient calls GitHub; nil means a client of the service's own (closed by Close).
	HTTPClient *http.Client
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

// Server implements GitHubTokenService.
type Server struct {
	taskrunnerv1.UnimplementedGitHubTokenServiceServer
	cfg   Config
	tasks Tasks
	gh    *githubAPI
	cache *tokenCache // nil in personal-token mode
	log   *slog.Logger
	now   func() time.Time
	// flights collapses concurrent requests for one repository into one GitHub round trip
	// in this process. Across replicas there is no lock: two replicas that miss the cache at
	// the same moment each mint a token (GitHub allows many live installation tokens) and
	// the last write wins in Redis; both tokens stay valid until they expire.
	flights   singleflight.Group
	ownClient *http.Client
}

var _ taskrunnerv1.GitHubTokenServiceServer = (*Server)(nil)

// New validates cfg, loads the App key and returns the server.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if deps.Tasks == nil {
		return nil, errors.New("githubtoken: Deps.Tasks is required")
	}
	s := &Server{cfg: cfg, tasks: deps.Tasks, log: deps.Logger, now: deps.Now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	hc := deps.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		s.ownClient = hc
	}
	apiURL := cfg.APIURL
	if !strings.HasSuffix(apiURL, "/") {
		apiURL += "/"
	}
	base, err := url.Parse(apiURL)
	if err != nil {
		return nil, errors.New("TASKRUNNER_GITHUB_API_URL: not a URL")
	}
	s.gh = &githubAPI{base: base, http: hc, appID: cfg.AppID, token: cfg.Token, now: s.now}
	if cfg.Token != "" {
		s.gh.secret = []string{cfg.Token}
	}
	if cfg.AppMode() {
		key, pemBytes, err := cfg.appKey()
		if err != nil {
			return nil, err
		}
		s.gh.key = key
		if deps.Redis == nil {
			return nil, errors.New("githubtoken: Deps.Redis is required in App mode")
		}
		ck, err := cacheKey(cfg, pemBytes)
		if err != nil {
			return nil, err
		}
		if s.cache, err = newTokenCache(deps.Redis, cfg.CachePrefix, ck); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func cacheKey(cfg Config, appKeyPEM []byte) ([]byte, error) {
	if cfg.CacheKey != "" {
		k, err := base64.StdEncoding.DecodeString(cfg.CacheKey)
		if err != nil || len(k) != 32 {
			return nil, errors.New("TASKRUNNER_GITHUB_CACHE_KEY: want 32 bytes in standard base64")
		}
		return k, nil
	}
	k, err := deriveCacheKey(appKeyPEM)
	if err != nil {
		return nil, errors.New("githubtoken: derive cache key")
	}
	return k, nil
}

// Close releases the HTTP connections of a client New created itself.
func (s *Server) Close() {
	if s.ownClient != nil {
		s.ownClient.CloseIdleConnections()
	}
}

// IssueRepoToken implements GitHubTokenService. The caller is the runner of a live task,
// identified by its verified client certificate; the token is for that task's repository.
func (s *Server) IssueRepoToken(ctx context.Context, req *taskrunnerv1.IssueRepoTokenRequest) (*taskrunnerv1.IssueRepoTokenResponse, error) {
	taskID, err := pki.TaskIDFromContext(ctx, s.cfg.TrustDomain)
	switch {
	case errors.Is(err, pki.ErrNoVerifiedCert):
		return nil, errs.Unauthenticated("IssueRepoToken needs a runner client certificate")
	case err != nil:
		s.log.WarnContext(ctx, "repo token refused: certificate is not a task identity", "error", err.Error())
		return nil, errs.PermissionDenied("the client certificate does not identify a task")
	}
	if req.GetTaskId() != "" && req.GetTaskId() != taskID {
		s.log.WarnContext(ctx, "repo token refused: task id differs from certificate", "task_id", taskID)
		return nil, errs.PermissionDenied("task_id does not match the client certificate")
	}
	t, err := s.tasks.Get(ctx, taskID, "")
	if errors.Is(err, errs.ErrNotFound) {
		return nil, errs.PermissionDenied("the certificate's task does not exist")
	}
	if err != nil {
		return nil, err
	}
	// Every non-terminal status counts as live: the runner can start before Dispatch has
	// recorded `running`, and it may still push while the PR awaits review.
	if t.Status.Terminal() {
		s.log.InfoContext(ctx, "repo token refused: task is finished", "task_id", t.ID, "status", string(t.Status))
		return nil, errs.PermissionDenied(fmt.Sprintf("task %s is %s: tokens are issued only to live tasks", t.ID, t.Status))
	}
	tok, exp, inst, cached, err := s.repoToken(ctx, t.Repo)
	if errors.Is(err, errs.ErrPermissionDenied) {
		// The certificate was fine; GitHub said no. Say so, with the repository, so that the
		// runner does not blame its certificate (ReasonRepoInaccessible).
		return nil, &errs.Error{Kind: errs.ErrPermissionDenied, Reason: ReasonRepoInaccessible,
			Message: fmt.Sprintf("the GitHub App cannot access %s: install it on the repository (or check that the repository exists)", t.Repo)}
	}
	if err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "repo token issued", "task_id", t.ID, "repo", t.Repo, "installation", inst,
		"cached", cached, "expire_time", exp.UTC().Format(time.RFC3339))
	return &taskrunnerv1.IssueRepoTokenResponse{
		Token:      tok,
		ExpireTime: timestamppb.New(exp),
		Repo:       t.Repo,
		ApiBaseUrl: s.cfg.APIURL,
		GitBaseUrl: strings.TrimSuffix(s.cfg.GitURL, "/"),
	}, nil
}

// ReasonRepoInaccessible is the ErrorInfo reason of IssueRepoToken's refusal when the task
// certificate is accepted but the App cannot access the task's repository (the runner's
// repotoken package names the cause from it).
const ReasonRepoInaccessible = "REPO_INACCESSIBLE"

// What RepoAccessResponse.missing names when access is refused.
const (
	MissingInstallation = "installation"
	MissingRepository   = "repository"
	MissingBranch       = "branch"
)

// RepoAccess implements GitHubTokenService for internal callers.
func (s *Server) RepoAccess(ctx context.Context, req *taskrunnerv1.RepoAccessRequest) (*taskrunnerv1.RepoAccessResponse, error) {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return nil, err
	}
	return s.CheckRepo(ctx, req.GetRepo(), req.GetBaseBranch())
}

// CheckRepo is RepoAccess for a caller in this process that has already authorized its own
// caller (TaskService checks a task's repository before it spends anything): whether the
// GitHub App (or the personal token) can act on repo and, when branch is not empty, whether
// the branch exists. A definite "no" is an answer (accessible false, missing set); only a
// failure to ask GitHub is an error.
func (s *Server) CheckRepo(ctx context.Context, repo, branch string) (*taskrunnerv1.RepoAccessResponse, error) {
	if err := task.ValidateRepo("repo", repo); err != nil {
		return nil, err
	}
	if branch != "" {
		if err := task.ValidateBranch("base_branch", branch); err != nil {
			return nil, err
		}
	}
	owner, name, _ := strings.Cut(repo, "/")
	out := &taskrunnerv1.RepoAccessResponse{Accessible: true}
	if !s.cfg.AppMode() {
		ok, err := s.gh.repoReachable(ctx, owner, name)
		if err != nil {
			return nil, s.domainError(ctx, err)
		}
		if !ok {
			return &taskrunnerv1.RepoAccessResponse{Missing: MissingRepository}, nil
		}
	} else {
		inst, err := s.installation(ctx, repo)
		if err != nil {
			if statusOf(err) == http.StatusNotFound {
				return &taskrunnerv1.RepoAccessResponse{Missing: MissingInstallation}, nil
			}
			return nil, s.domainError(ctx, err)
		}
		out.InstallationId = inst
	}
	if branch == "" {
		return out, nil
	}
	tok, _, _, _, err := s.repoToken(ctx, repo)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	found, err := s.gh.branchExists(cctx, tok, owner, name, branch)
	if err != nil {
		return nil, s.domainError(ctx, err)
	}
	if !found {
		out.Accessible, out.Missing = false, MissingBranch
	}
	return out, nil
}

// repoToken returns a token for repo: the personal token, or a cached or new installation
// token. Concurrent callers for one repository share one flight; each still honours its own
// context.
func (s *Server) repoToken(ctx context.Context, repo string) (tok string, exp time.Time, inst int64, cached bool, err error) {
	if !s.cfg.AppMode() {
		// The personal token has no expiry we know of; an hour tells the runner when to ask
		// again, as with installation tokens.
		return s.cfg.Token, s.now().Add(time.Hour), 0, false, nil
	}
	type result struct {
		ct     cachedToken
		inst   int64
		cached bool
	}
	ch := s.flights.DoChan(repoKey(repo), func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*s.cfg.Timeout)
		defer cancel()
		ct, inst, cached, err := s.fetch(fctx, repo)
		return result{ct, inst, cached}, err
	})
	select {
	case <-ctx.Done():
		return "", time.Time{}, 0, false, ctx.Err()
	case r := <-ch:
		if r.Err != nil {
			return "", time.Time{}, 0, false, s.domainError(ctx, r.Err)
		}
		res := r.Val.(result)
		return res.ct.Token, res.ct.ExpiresAt, res.inst, res.cached, nil
	}
}

// fetch is one flight: installation (cached), then token (cached, else minted and cached).
func (s *Server) fetch(ctx context.Context, repo string) (cachedToken, int64, bool, error) {
	inst, err := s.installation(ctx, repo)
	if err != nil {
		return cachedToken{}, 0, false, err
	}
	now := s.now()
	ct, ok, err := s.cache.token(ctx, inst, repo, now, s.cfg.RefreshBefore)
	if err != nil {
		s.log.WarnContext(ctx, "token cache read failed; minting", "repo", repo, "error", err.Error())
	}
	if ok {
		return ct, inst, true, nil
	}
	_, name, _ := strings.Cut(repo, "/")
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	text, exp, err := s.gh.mint(cctx, inst, name)
	if err != nil {
		if st := statusOf(err); st == http.StatusNotFound || st == http.StatusUnprocessableEntity {
			// The App was uninstalled or lost the repository: look it up afresh next time.
			if ferr := s.cache.forgetInstallation(ctx, repo); ferr != nil {
				s.log.WarnContext(ctx, "token cache: forget installation failed", "repo", repo, "error", ferr.Error())
			}
		}
		return cachedToken{}, 0, false, err
	}
	ct = cachedToken{Token: text, ExpiresAt: exp}
	if err := s.cache.setToken(ctx, inst, repo, ct, s.now(), s.cfg.RefreshBefore); err != nil {
		s.log.WarnContext(ctx, "token cache write failed", "repo", repo, "error", err.Error())
	}
	s.log.InfoContext(ctx, "installation token minted", "repo", repo, "installation", inst,
		"expire_time", exp.UTC().Format(time.RFC3339))
	return ct, inst, false, nil
}

// installation returns the App's installation id on repo, from Redis or GitHub.
func (s *Server) installation(ctx context.Context, repo string) (int64, error) {
	id, err := s.cache.installation(ctx, repo)
	if err != nil {
		s.log.WarnContext(ctx, "token cache read failed; looking up installation", "repo", repo, "error", err.Error())
	}
	if id > 0 {
		return id, nil
	}
	owner, name, _ := strings.Cut(repo, "/")
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	id, err = s.gh.findInstallation(cctx, owner, name)
	if err != nil {
		return 0, err
	}
	if err := s.cache.setInstallation(ctx, repo, id); err != nil {
		s.log.WarnContext(ctx, "token cache write failed", "repo", repo, "error", err.Error())
	}
	return id, nil
}

// domainError maps a GitHub failure to what the runner may see and logs the (redacted)
// detail. Unavailable is what the runner retries.
func (s *Server) domainError(ctx context.Context, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		s.log.ErrorContext(ctx, "github token error", "error", redactMessage(err.Error(), s.gh.secret...))
		return errs.Unavailable("GitHub could not be reached")
	}
	s.log.WarnContext(ctx, "github call failed", "op", ae.Op, "status", ae.Status, "message", ae.Message)
	switch {
	case ae.Status == http.StatusNotFound || ae.Status == http.StatusUnprocessableEntity:
		return errs.PermissionDenied("the GitHub App is not installed on the repository or cannot access it")
	case ae.Status == http.StatusUnauthorized:
		// Our App credentials were refused: a configuration problem, not the caller's.
		return errors.New(ae.Error())
	case ae.Status == 0, ae.Status == http.StatusForbidden, ae.Status == http.StatusTooManyRequests, ae.Status >= 500:
		return errs.Unavailable("GitHub is unavailable or rate limited; retry later")
	}
	return errors.New(ae.Error())
}
