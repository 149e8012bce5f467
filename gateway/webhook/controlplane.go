package webhook

import (
	"context"

	"github.com/google/go-github/v62/github"
	"google.golang.org/grpc"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// GitHubReads is the part of GitHubTokenService the webhook needs: GitHub
// reads made by the control plane with the App's credentials for one
// repository (the gateway holds none).
type GitHubReads interface {
	RepoPermission(ctx context.Context, in *taskrunnerv1.RepoPermissionRequest, opts ...grpc.CallOption) (*taskrunnerv1.RepoPermissionResponse, error)
	ReviewComments(ctx context.Context, in *taskrunnerv1.ReviewCommentsRequest, opts ...grpc.CallOption) (*taskrunnerv1.ReviewCommentsResponse, error)
	PullRequestHead(ctx context.Context, in *taskrunnerv1.PullRequestHeadRequest, opts ...grpc.CallOption) (*taskrunnerv1.PullRequestHeadResponse, error)
}

// FollowUpRuns is TaskService's FollowUpTask.
type FollowUpRuns interface {
	FollowUpTask(ctx context.Context, in *taskrunnerv1.FollowUpTaskRequest, opts ...grpc.CallOption) (*taskrunnerv1.FollowUpTaskResponse, error)
}

// ControlPlane implements FollowUps, Permissions and PullRequests through
// taskrunnerd's internal RPCs (the gateway's internal token authorises
// them).
type ControlPlane struct {
	Tasks  FollowUpRuns
	GitHub GitHubReads
}

var (
	_ FollowUps    = ControlPlane{}
	_ Permissions  = ControlPlane{}
	_ PullRequests = ControlPlane{}
)

// FollowUp asks TaskService for a follow-up run.
func (c ControlPlane) FollowUp(ctx context.Context, taskID, prompt, requestID, trigger, author string) (bool, error) {
	resp, err := c.Tasks.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: taskID, Prompt: prompt, RequestId: requestID,
		Trigger: trigger, RequestedBy: "github:" + author})
	if err != nil {
		return false, err
	}
	return resp.GetCreated(), nil
}

// Permission asks GitHub, through the control plane.
func (c ControlPlane) Permission(ctx context.Context, repo, login string) (string, error) {
	resp, err := c.GitHub.RepoPermission(ctx, &taskrunnerv1.RepoPermissionRequest{Repo: repo, Login: login})
	if err != nil {
		return "", err
	}
	return resp.GetPermission(), nil
}

// ReviewComments lists a review's comments, through the control plane.
func (c ControlPlane) ReviewComments(ctx context.Context, repo string, number int, reviewID int64) ([]*github.PullRequestComment, error) {
	resp, err := c.GitHub.ReviewComments(ctx, &taskrunnerv1.ReviewCommentsRequest{Repo: repo, Number: int64(number), ReviewId: reviewID})
	if err != nil {
		return nil, err
	}
	out := make([]*github.PullRequestComment, 0, len(resp.GetComments()))
	for _, cm := range resp.GetComments() {
		out = append(out, &github.PullRequestComment{Path: github.String(cm.GetPath()), Line: github.Int(int(cm.GetLine())),
			Body: github.String(cm.GetBody()), User: &github.User{Login: github.String(cm.GetLogin())}})
	}
	return out, nil
}

// PullRequest returns the pull request's head branch and state, through
// the control plane.
func (c ControlPlane) PullRequest(ctx context.Context, repo string, number int) (*github.PullRequest, error) {
	resp, err := c.GitHub.PullRequestHead(ctx, &taskrunnerv1.PullRequestHeadRequest{Repo: repo, Number: int64(number)})
	if err != nil {
		return nil, err
	}
	return &github.PullRequest{Number: github.Int(number), State: github.String(resp.GetState()),
		Head: &github.PullRequestBranch{Ref: github.String(resp.GetHeadRef())}}, nil
}
