package githubtoken

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/go-github/v62/github"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/task"
)

// What the webhook reads from GitHub to obey a follow-up, with a token for
// that one repository; internal callers only.

func (s *Server) repoClient(ctx context.Context, repo string) (*github.Client, string, string, error) {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return nil, "", "", err
	}
	if err := task.ValidateRepo("repo", repo); err != nil {
		return nil, "", "", err
	}
	tok, _, _, _, err := s.repoToken(ctx, repo)
	if err != nil {
		return nil, "", "", err
	}
	owner, name, _ := strings.Cut(repo, "/")
	return s.gh.client("token " + tok), owner, name, nil
}

// RepoPermission implements GitHubTokenService.
func (s *Server) RepoPermission(ctx context.Context, req *taskrunnerv1.RepoPermissionRequest) (*taskrunnerv1.RepoPermissionResponse, error) {
	c, owner, name, err := s.repoClient(ctx, req.GetRepo())
	if err != nil {
		return nil, err
	}
	if req.GetLogin() == "" {
		return nil, errs.Invalid("login", "is required")
	}
	p, resp, err := c.Repositories.GetPermissionLevel(ctx, owner, name, req.GetLogin())
	if resp != nil && resp.StatusCode == 404 {
		return &taskrunnerv1.RepoPermissionResponse{Permission: "none"}, nil
	}
	if err != nil {
		return nil, s.domainError(ctx, s.gh.sanitize("get permission of "+req.GetLogin()+" on "+req.GetRepo(), resp, err))
	}
	return &taskrunnerv1.RepoPermissionResponse{Permission: p.GetPermission()}, nil
}

// ReviewComments implements GitHubTokenService (every page).
func (s *Server) ReviewComments(ctx context.Context, req *taskrunnerv1.ReviewCommentsRequest) (*taskrunnerv1.ReviewCommentsResponse, error) {
	c, owner, name, err := s.repoClient(ctx, req.GetRepo())
	if err != nil {
		return nil, err
	}
	out := &taskrunnerv1.ReviewCommentsResponse{}
	opts := &github.ListOptions{PerPage: 100}
	for {
		cs, resp, err := c.PullRequests.ListReviewComments(ctx, owner, name, int(req.GetNumber()), req.GetReviewId(), opts)
		if err != nil {
			return nil, s.domainError(ctx, s.gh.sanitize(fmt.Sprintf("list comments of review %d", req.GetReviewId()), resp, err))
		}
		for _, cm := range cs {
			line := cm.GetLine()
			if line == 0 {
				line = cm.GetOriginalLine()
			}
			out.Comments = append(out.Comments, &taskrunnerv1.ReviewComment{Path: cm.GetPath(), Line: int64(line), Body: cm.GetBody(), Login: cm.GetUser().GetLogin()})
		}
		if resp.NextPage == 0 {
			return out, nil
		}
		opts.Page = resp.NextPage
	}
}

// PullRequestHead implements GitHubTokenService.
func (s *Server) PullRequestHead(ctx context.Context, req *taskrunnerv1.PullRequestHeadRequest) (*taskrunnerv1.PullRequestHeadResponse, error) {
	c, owner, name, err := s.repoClient(ctx, req.GetRepo())
	if err != nil {
		return nil, err
	}
	pr, resp, err := c.PullRequests.Get(ctx, owner, name, int(req.GetNumber()))
	if err != nil {
		return nil, s.domainError(ctx, s.gh.sanitize(fmt.Sprintf("get pull request %s#%d", req.GetRepo(), req.GetNumber()), resp, err))
	}
	return &taskrunnerv1.PullRequestHeadResponse{HeadRef: pr.GetHead().GetRef(), State: pr.GetState()}, nil
}
