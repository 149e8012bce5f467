package githubtoken

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/go-github/v62/github"

	"github.com/taskrunner/taskrunner/services/errs"
)

// ClosePullRequest comments on a task's pull request and closes it, with a
// token for that one repository (the App's installation token, or the
// personal token). Dispatch calls it when a task awaiting review is
// cancelled. An already closed pull request is success.
func (s *Server) ClosePullRequest(ctx context.Context, repo string, number int, comment string) error {
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || number <= 0 {
		return errs.Invalid("repo", "want owner/name and a pull request number, got %q #%d", repo, number)
	}
	tok, _, _, _, err := s.repoToken(ctx, repo)
	if err != nil {
		return err
	}
	c := s.gh.client("token " + tok)
	if comment != "" {
		if _, resp, err := c.Issues.CreateComment(ctx, owner, name, number, &github.IssueComment{Body: github.String(comment)}); err != nil {
			return s.gh.sanitize(fmt.Sprintf("comment on pull request %s#%d", repo, number), resp, err)
		}
	}
	if _, resp, err := c.PullRequests.Edit(ctx, owner, name, number, &github.PullRequest{State: github.String("closed")}); err != nil {
		return s.gh.sanitize(fmt.Sprintf("close pull request %s#%d", repo, number), resp, err)
	}
	return nil
}
