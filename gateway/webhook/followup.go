package webhook

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/google/go-github/v62/github"
	"google.golang.org/grpc/codes"
)

// Follow-ups (ARCHITECTURE.md: "A task has runs"): a review, or a conversation comment that
// mentions the configured handle, on a task's pull request asks for a new run of the task on
// the same branch. The receiver only turns the event into a prompt and hands it to FollowUps;
// TaskService decides whether the task may run again.
//
// Who is obeyed: only an author whose permission on the repository is admin or write (GitHub's
// "maintain" role reports write). Bots are never obeyed, so the agent's own comments cannot
// start runs.
//
// Which events: pull_request_review "submitted" with state changes_requested or commented
// (an approval asks for nothing); issue_comment "created" on a pull request. GitHub files
// every review comment under a review and sends pull_request_review for it, even for a lone
// comment, so pull_request_review_comment is acknowledged and otherwise ignored: acting on it
// too would start a run per comment.

// FollowUps is the hook point for follow-up runs. The follow-up RPC does not exist yet; whoever
// adds it implements this (a TaskService client call). When the handler has none, review and
// comment events are verified, parsed, logged and answered 202.
type FollowUps interface {
	// FollowUp asks for a new run of taskID with prompt. requestID is
	// "github-delivery:<X-GitHub-Delivery>": a redelivered webhook repeats it, and must get
	// applied == false without a second run (the idempotency rule of AdvanceTask). Errors are
	// gRPC statuses: NotFound and FailedPrecondition (the task cannot run again now) are
	// acknowledged with 202; Unavailable and its kin get 503 so GitHub's redelivery can retry.
	// trigger is "review" or "comment"; author the GitHub login who asked.
	FollowUp(ctx context.Context, taskID, prompt, requestID, trigger, author string) (applied bool, err error)
}

// Permissions reports a user's permission on a repository, as GitHub's
// GET /repos/{owner}/{repo}/collaborators/{username}/permission does. The gateway holds no
// GitHub credentials: services/githubtoken implements it with go-github (not this package).
type Permissions interface {
	// Permission returns "admin", "write", "read" or "none" for login on repo ("owner/name").
	// An error means GitHub could not be asked; the delivery is then answered 503. Errors
	// of this interface and of PullRequests are logged, so they must carry no credential.
	Permission(ctx context.Context, repo, login string) (string, error)
}

// PullRequests reads what webhook payloads leave out. Implemented with go-github in
// services/githubtoken (not this package), like Permissions.
type PullRequests interface {
	// ReviewComments lists every comment of one review, oldest first:
	// GET /repos/{owner}/{repo}/pulls/{number}/reviews/{review_id}/comments, all pages.
	// A pull_request_review payload carries the review's body but not its comments.
	ReviewComments(ctx context.Context, repo string, number int, reviewID int64) ([]*github.PullRequestComment, error)
	// PullRequest is GET /repos/{owner}/{repo}/pulls/{number}: an issue_comment payload names
	// the pull request but not its head branch, which names the task.
	PullRequest(ctx context.Context, repo string, number int) (*github.PullRequest, error)
}

// FollowUpDeps enables follow-ups. Runs, Permissions and PullRequests are needed together:
// follow-ups without a permission check would obey anyone who can comment.
type FollowUpDeps struct {
	Runs         FollowUps
	Permissions  Permissions
	PullRequests PullRequests
}

func (d FollowUpDeps) validate() error {
	if d.Runs != nil && (d.Permissions == nil || d.PullRequests == nil) {
		return errors.New("webhook: follow-ups need Permissions and PullRequests as well as Runs")
	}
	return nil
}

const opFollowUp = "follow up"

func (h *Handler) followUpsEnabled() bool { return h.follow.Runs != nil }

func isBot(u *github.User) bool {
	return u.GetType() == "Bot" || strings.HasSuffix(u.GetLogin(), "[bot]")
}

// reviewComment acknowledges pull_request_review_comment: the review it belongs to is acted on.
func (h *Handler) reviewComment(ctx context.Context, d verifiedDelivery, ev *github.PullRequestReviewCommentEvent) answer {
	if ev.Comment == nil || ev.PullRequest == nil || ev.Repo == nil {
		return fail(http.StatusBadRequest, codes.InvalidArgument, "BAD_PAYLOAD", "not a pull_request_review_comment payload", "")
	}
	d.log.InfoContext(ctx, "webhook acknowledged: review comments are acted on with their review",
		"repo", ev.Repo.GetFullName(), "pr_number", ev.PullRequest.GetNumber(), "review_id", ev.Comment.GetPullRequestReviewID(), "action", ev.GetAction())
	return ignored("review comments are acted on with their review (pull_request_review)", "")
}

// review handles pull_request_review.
func (h *Handler) review(ctx context.Context, d verifiedDelivery, ev *github.PullRequestReviewEvent) answer {
	if ev.Review == nil || ev.PullRequest == nil || ev.Repo == nil {
		return fail(http.StatusBadRequest, codes.InvalidArgument, "BAD_PAYLOAD", "not a pull_request_review payload", "")
	}
	rv, pr := ev.Review, ev.PullRequest
	author := rv.GetUser()
	if author == nil {
		author = ev.GetSender()
	}
	lg := d.log.With("repo", ev.Repo.GetFullName(), "pr_number", pr.GetNumber(), "review_id", rv.GetID(), "author", author.GetLogin(), "state", rv.GetState())
	switch {
	case ev.GetAction() != "submitted":
		return ignored("action "+ev.GetAction()+" is not handled", "")
	case isBot(author):
		lg.InfoContext(ctx, "webhook ignored: review by a bot")
		return ignored("reviews by bots are not obeyed", "")
	case !strings.EqualFold(rv.GetState(), "changes_requested") && !strings.EqualFold(rv.GetState(), "commented"):
		lg.InfoContext(ctx, "webhook ignored: review asks for no change")
		return ignored("a review in state "+strings.ToLower(rv.GetState())+" asks for no follow-up", "")
	case !h.followUpsEnabled():
		lg.InfoContext(ctx, "webhook recognised: follow-ups are not enabled")
		return ignored("follow-ups are not enabled", "")
	}
	if a, valid := checkDelivery(d); !valid {
		return a
	}
	number := int64(pr.GetNumber())
	id, lg, a, found := h.taskOf(ctx, verifiedDelivery{event: d.event, id: d.id, log: lg}, ev.Repo, pr.GetHead(), number)
	if !found {
		return a
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	if a, allowed := h.mayAsk(ctx, lg, id, ev.Repo.GetFullName(), number, author); !allowed {
		return a
	}
	comments, err := h.follow.PullRequests.ReviewComments(ctx, ev.Repo.GetFullName(), pr.GetNumber(), rv.GetID())
	if err != nil {
		return githubError(ctx, lg, "list review comments", id, err)
	}
	prompt, any := ReviewPrompt(rv, comments)
	if !any {
		lg.InfoContext(ctx, "webhook ignored: empty review")
		return ignored("the review has no text", id)
	}
	return h.followUp(ctx, lg, id, prompt, d, "review", author.GetLogin())
}

// issueComment handles issue_comment on a pull request.
func (h *Handler) issueComment(ctx context.Context, d verifiedDelivery, ev *github.IssueCommentEvent) answer {
	if ev.Issue == nil || ev.Comment == nil || ev.Repo == nil {
		return fail(http.StatusBadRequest, codes.InvalidArgument, "BAD_PAYLOAD", "not an issue_comment payload", "")
	}
	author := ev.Comment.GetUser()
	if author == nil {
		author = ev.GetSender()
	}
	number := ev.Issue.GetNumber()
	lg := d.log.With("repo", ev.Repo.GetFullName(), "pr_number", number, "comment_id", ev.Comment.GetID(), "author", author.GetLogin())
	prompt, mentioned := CommentPrompt(ev.Comment.GetBody(), author.GetLogin(), h.cfg.Mention)
	switch {
	case ev.GetAction() != "created":
		return ignored("action "+ev.GetAction()+" is not handled", "")
	case !ev.Issue.IsPullRequest():
		return ignored("the issue is not a pull request", "")
	case isBot(author):
		lg.InfoContext(ctx, "webhook ignored: comment by a bot")
		return ignored("comments by bots are not obeyed", "")
	case !mentioned:
		lg.DebugContext(ctx, "webhook ignored: comment does not mention the handle")
		return ignored("the comment does not mention "+h.cfg.Mention, "")
	case !h.followUpsEnabled():
		lg.InfoContext(ctx, "webhook recognised: follow-ups are not enabled")
		return ignored("follow-ups are not enabled", "")
	}
	if a, valid := checkDelivery(d); !valid {
		return a
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	pr, err := h.follow.PullRequests.PullRequest(ctx, ev.Repo.GetFullName(), number)
	if err != nil {
		return githubError(ctx, lg, "get pull request", "", err)
	}
	id, lg, a, found := h.taskOf(ctx, verifiedDelivery{event: d.event, id: d.id, log: lg}, ev.Repo, pr.GetHead(), int64(number))
	if !found {
		return a
	}
	if a, allowed := h.mayAsk(ctx, lg, id, ev.Repo.GetFullName(), int64(number), author); !allowed {
		return a
	}
	return h.followUp(ctx, lg, id, prompt, d, "comment", author.GetLogin())
}

// mayAsk checks that the pull request is the task's and that its author has write permission.
func (h *Handler) mayAsk(ctx context.Context, lg *slog.Logger, id, repo string, number int64, author *github.User) (answer, bool) {
	if _, a, found := h.taskFor(ctx, lg, id, repo, number); !found {
		return a, false
	}
	perm, err := h.follow.Permissions.Permission(ctx, repo, author.GetLogin())
	if err != nil {
		return githubError(ctx, lg, "get permission", id, err), false
	}
	if perm != "admin" && perm != "write" {
		lg.InfoContext(ctx, "webhook ignored: author may not ask for a follow-up", "permission", perm)
		return ignored("the author has "+perm+" permission; follow-ups need write", id), false
	}
	return answer{}, true
}

func (h *Handler) followUp(ctx context.Context, lg *slog.Logger, id, prompt string, d verifiedDelivery, trigger, author string) answer {
	applied, err := h.follow.Runs.FollowUp(ctx, id, prompt, requestIDPrefix+d.id, trigger, author)
	if err != nil {
		return h.taskError(ctx, lg, opFollowUp, id, err)
	}
	if !applied {
		lg.InfoContext(ctx, "webhook repeated: follow-up already requested")
		return ok(http.StatusOK, reply{Result: "duplicate", TaskID: id})
	}
	// The prompt quotes the comments: its length is logged, never its text.
	lg.InfoContext(ctx, "webhook applied: follow-up requested", "prompt_bytes", len(prompt))
	return ok(http.StatusOK, reply{Result: "follow_up", TaskID: id})
}

// githubError answers a failed GitHub read with 503, so that GitHub's redelivery can retry.
func githubError(ctx context.Context, lg *slog.Logger, op, id string, err error) answer {
	lg.WarnContext(ctx, "webhook failed: GitHub unavailable", "op", op, "error", err.Error())
	return fail(http.StatusServiceUnavailable, codes.Unavailable, "GITHUB_UNAVAILABLE", "could not ask GitHub; redeliver later", id)
}
