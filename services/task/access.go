package task

import (
	"context"
	"fmt"
	"sync"
	"time"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
)

// RepoChecker answers whether a task's repository and base branch can be
// worked on: GitHubTokenService's RepoAccess (githubtoken.Server.CheckRepo
// in process). A definite "no" is an answer (Accessible false, Missing
// "installation", "repository" or "branch"); an error means GitHub could
// not be asked. It must not spend anything.
type RepoChecker interface {
	CheckRepo(ctx context.Context, repo, branch string) (*taskrunnerv1.RepoAccessResponse, error)
}

// AccessCacheTTL is how long an answer of the RepoChecker is reused for one
// repository and branch. Short, because an App is installed (or a branch
// pushed) right after a refusal and the user retries; long enough that a
// burst of creates for one repository asks GitHub once.
const AccessCacheTTL = 30 * time.Second

// Reasons (errdetails.ErrorInfo) of a refusal, for clients that branch.
const (
	ReasonRepoInaccessible = "REPO_INACCESSIBLE"
	ReasonBranchNotFound   = "BRANCH_NOT_FOUND"
)

// accessCache keeps the RepoChecker's answers per repo@branch, in this
// process only: a replica that has not seen the answer asks GitHub itself,
// which costs one call and is never wrong for longer than the TTL.
type accessCache struct {
	mu  sync.Mutex
	now func() time.Time
	m   map[string]accessEntry
}

type accessEntry struct {
	resp    *taskrunnerv1.RepoAccessResponse
	expires time.Time
}

// maxAccessEntries bounds the cache; past it, expired entries are dropped,
// and if none are, the whole cache (it is only a cache).
const maxAccessEntries = 4096

func (c *accessCache) get(key string) (*taskrunnerv1.RepoAccessResponse, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || !c.now().Before(e.expires) {
		return nil, false
	}
	return e.resp, true
}

func (c *accessCache) put(key string, resp *taskrunnerv1.RepoAccessResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if c.m == nil {
		c.m = map[string]accessEntry{}
	}
	if len(c.m) >= maxAccessEntries {
		for k, e := range c.m {
			if !now.Before(e.expires) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxAccessEntries {
			clear(c.m)
		}
	}
	c.m[key] = accessEntry{resp: resp, expires: now.Add(AccessCacheTTL)}
}

// SetRepoChecker makes CreateTask, RetryTask and DispatchTask refuse a task
// whose repository or base branch GitHub says is missing or out of the
// App's reach, before anything is stored or spent. nil (the default, when
// no GitHubTokenService is configured in this process) checks nothing.
func (s *Server) SetRepoChecker(c RepoChecker) { s.repos = c }

// checkRepo refuses (FailedPrecondition, naming the repository and what is
// missing) a repository or branch the RepoChecker says cannot be used. A
// failure to ask GitHub is returned as is (Unavailable: retry later), since
// a task could not clone either.
func (s *Server) checkRepo(ctx context.Context, repo, branch string) error {
	if s.repos == nil {
		return nil
	}
	key := repo + "@" + branch
	resp, ok := s.access.get(key)
	if !ok {
		var err error
		resp, err = s.repos.CheckRepo(ctx, repo, branch)
		if err != nil {
			return err
		}
		s.access.put(key, resp)
	}
	if resp.GetAccessible() {
		return nil
	}
	s.log.InfoContext(ctx, "task refused: repository not usable", "repo", repo, "base_branch", branch, "missing", resp.GetMissing())
	return RepoRefusal(repo, branch, resp.GetMissing())
}

// RepoRefusal is the error a client sees for a repository or branch that
// cannot be used; missing is RepoAccessResponse.missing.
func RepoRefusal(repo, branch, missing string) error {
	switch missing {
	case "branch":
		return &errs.Error{Kind: errs.ErrInvalidTransition, Reason: ReasonBranchNotFound,
			Message: fmt.Sprintf("%s has no branch %s: push it, or choose another base_branch", repo, truncate(branch, 80))}
	case "repository":
		return &errs.Error{Kind: errs.ErrInvalidTransition, Reason: ReasonRepoInaccessible,
			Message: fmt.Sprintf("the GitHub token cannot read %s: check the repository's name, or give the token access to it", repo)}
	}
	return &errs.Error{Kind: errs.ErrInvalidTransition, Reason: ReasonRepoInaccessible,
		Message: fmt.Sprintf("the GitHub App cannot access %s: install it on the repository (or check that the repository exists)", repo)}
}
