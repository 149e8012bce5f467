package forge

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/google/go-github/v62/github"
)

// Every response body and webhook payload is built from go-github's types, so the forge cannot
// answer in a shape the real API does not have (issue 14). The forge's own records (PullRequest, review, comment) are
// storage types; they are converted here, per request, because URLs depend on the base URL.

func ts(t time.Time) *github.Timestamp {
	if t.IsZero() {
		return nil
	}
	return &github.Timestamp{Time: t.UTC()}
}

// userID is a stable id for a login that is not an owner: users exist in the forge only by
// name, and a hash keeps the id the same across restarts without any state.
func userID(login string) int64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(strings.ToLower(login)))
	return 1_000_000_000 + int64(h.Sum32())
}

// permissionsStruct converts a {"contents":"write"} map into go-github's struct; the map keys are
// its JSON field names.
func permissionsStruct(m map[string]string) *github.InstallationPermissions {
	data, err := json.Marshal(m)
	if err != nil {
		panic(err) // a map[string]string always marshals
	}
	var p github.InstallationPermissions
	if err := json.Unmarshal(data, &p); err != nil {
		panic(err)
	}
	return &p
}

func (f *Forge) renderOwner(base string, o *owner) *github.User {
	return &github.User{
		Login: github.String(o.login), ID: github.Int64(o.id), NodeID: github.String(fmt.Sprintf("O_forge%d", o.id)),
		Type: github.String("Organization"), SiteAdmin: github.Bool(false),
		HTMLURL: github.String(base + "/" + o.login), URL: github.String(base + "/users/" + o.login),
	}
}

func (f *Forge) renderUser(base, login string) *github.User {
	typ := "User"
	if strings.HasSuffix(login, "[bot]") {
		typ = "Bot"
	}
	id := userID(login)
	return &github.User{
		Login: github.String(login), ID: github.Int64(id), NodeID: github.String(fmt.Sprintf("U_forge%d", id)),
		Type: github.String(typ), SiteAdmin: github.Bool(false),
		HTMLURL: github.String(base + "/" + login), URL: github.String(base + "/users/" + login),
	}
}

func (f *Forge) renderRepo(base string, rp *repo) *github.Repository {
	full := rp.fullName()
	return &github.Repository{
		ID: github.Int64(rp.id), NodeID: github.String(fmt.Sprintf("R_forge%d", rp.id)), Name: github.String(rp.name),
		FullName: github.String(full), Private: github.Bool(true), Visibility: github.String("private"),
		Fork: github.Bool(false), Archived: github.Bool(false), Disabled: github.Bool(false),
		Owner: f.renderOwner(base, rp.owner), HTMLURL: github.String(base + "/" + full), URL: github.String(base + "/repos/" + full),
		CloneURL: github.String(base + "/" + full + ".git"), DefaultBranch: github.String(rp.defaultBranch),
		CreatedAt: ts(rp.createdAt), UpdatedAt: ts(rp.createdAt), PushedAt: ts(rp.createdAt),
	}
}

// installationEvents are the webhook events the forge's app subscribes to (and sends).
var installationEvents = []string{"issue_comment", "pull_request", "pull_request_review", "pull_request_review_comment", "push"}

func (f *Forge) renderInstallation(base string, o *owner) *github.Installation {
	return &github.Installation{
		ID: github.Int64(o.installationID), NodeID: github.String(fmt.Sprintf("I_forge%d", o.installationID)),
		AppID: github.Int64(f.cfg.AppID), AppSlug: github.String("forge"),
		Account: f.renderOwner(base, o), TargetID: github.Int64(o.id), TargetType: github.String("Organization"),
		RepositorySelection: github.String("all"), Permissions: permissionsStruct(installationPermissions),
		Events:          installationEvents,
		AccessTokensURL: github.String(fmt.Sprintf("%s/app/installations/%d/access_tokens", base, o.installationID)),
		RepositoriesURL: github.String(base + "/installation/repositories"),
		HTMLURL:         github.String(fmt.Sprintf("%s/settings/installations/%d", base, o.installationID)),
		CreatedAt:       ts(o.createdAt), UpdatedAt: ts(o.createdAt),
	}
}

// webhookInstallation is the installation as a webhook payload carries it: id and node id.
func webhookInstallation(rp *repo) *github.Installation {
	return &github.Installation{ID: github.Int64(rp.owner.installationID), NodeID: github.String(fmt.Sprintf("I_forge%d", rp.owner.installationID))}
}

func pullURLs(base string, rp *repo, number int) (api, html string) {
	full := rp.fullName()
	return fmt.Sprintf("%s/repos/%s/pulls/%d", base, full, number), fmt.Sprintf("%s/%s/pull/%d", base, full, number)
}

func (f *Forge) renderPull(base string, rp *repo, pr PullRequest) *github.PullRequest {
	full := rp.fullName()
	branch := func(ref, sha string) *github.PullRequestBranch {
		return &github.PullRequestBranch{
			Label: github.String(rp.owner.login + ":" + ref), Ref: github.String(ref), SHA: github.String(sha),
			Repo: f.renderRepo(base, rp), User: f.renderOwner(base, rp.owner),
		}
	}
	apiURL, htmlURL := pullURLs(base, rp, pr.Number)
	issueURL := fmt.Sprintf("%s/repos/%s/issues/%d", base, full, pr.Number)
	out := &github.PullRequest{
		ID: github.Int64(pr.ID), NodeID: github.String(fmt.Sprintf("PR_forge%d", pr.ID)), Number: github.Int(pr.Number),
		State: github.String(pr.State), Locked: github.Bool(false), Title: github.String(pr.Title), Body: github.String(pr.Body),
		Draft: github.Bool(pr.Draft), Merged: github.Bool(pr.Merged),
		CreatedAt: ts(pr.CreatedAt), UpdatedAt: ts(pr.UpdatedAt), ClosedAt: ts(pr.ClosedAt), MergedAt: ts(pr.MergedAt),
		HTMLURL: github.String(htmlURL), URL: github.String(apiURL),
		DiffURL: github.String(htmlURL + ".diff"), PatchURL: github.String(htmlURL + ".patch"),
		IssueURL: github.String(issueURL), CommentsURL: github.String(issueURL + "/comments"),
		ReviewCommentsURL: github.String(apiURL + "/comments"),
		Comments:          github.Int(pr.Comments), ReviewComments: github.Int(pr.ReviewComments),
		User: f.renderUser(base, pr.User),
		Head: branch(pr.Head, pr.HeadSHA), Base: branch(pr.Base, pr.BaseSHA),
	}
	if pr.State == "open" {
		out.Mergeable = github.Bool(true)
	}
	if pr.MergeCommitSHA != "" {
		out.MergeCommitSHA = github.String(pr.MergeCommitSHA)
	}
	if pr.MergedBy != "" {
		out.MergedBy = f.renderUser(base, pr.MergedBy)
	}
	return out
}

// renderPullAsIssue is a pull request as the issues API (and issue_comment webhooks) show it.
func (f *Forge) renderPullAsIssue(base string, rp *repo, pr PullRequest) *github.Issue {
	full := rp.fullName()
	apiURL, htmlURL := pullURLs(base, rp, pr.Number)
	issueURL := fmt.Sprintf("%s/repos/%s/issues/%d", base, full, pr.Number)
	return &github.Issue{
		ID: github.Int64(pr.ID), NodeID: github.String(fmt.Sprintf("PR_forge%d", pr.ID)), Number: github.Int(pr.Number),
		State: github.String(pr.State), Locked: github.Bool(false), Title: github.String(pr.Title), Body: github.String(pr.Body),
		User: f.renderUser(base, pr.User), Comments: github.Int(pr.Comments), Draft: github.Bool(pr.Draft),
		CreatedAt: ts(pr.CreatedAt), UpdatedAt: ts(pr.UpdatedAt), ClosedAt: ts(pr.ClosedAt),
		URL: github.String(issueURL), HTMLURL: github.String(htmlURL), CommentsURL: github.String(issueURL + "/comments"),
		RepositoryURL: github.String(base + "/repos/" + full),
		PullRequestLinks: &github.PullRequestLinks{
			URL: github.String(apiURL), HTMLURL: github.String(htmlURL),
			DiffURL: github.String(htmlURL + ".diff"), PatchURL: github.String(htmlURL + ".patch"), MergedAt: ts(pr.MergedAt),
		},
	}
}

func (f *Forge) renderReview(base string, rp *repo, rv Review) *github.PullRequestReview {
	apiURL, htmlURL := pullURLs(base, rp, rv.Number)
	return &github.PullRequestReview{
		ID: github.Int64(rv.ID), NodeID: github.String(fmt.Sprintf("PRR_forge%d", rv.ID)), User: f.renderUser(base, rv.User),
		Body: github.String(rv.Body), State: github.String(rv.State), CommitID: github.String(rv.CommitID),
		SubmittedAt: ts(rv.SubmittedAt), HTMLURL: github.String(fmt.Sprintf("%s#pullrequestreview-%d", htmlURL, rv.ID)),
		PullRequestURL: github.String(apiURL), AuthorAssociation: github.String(rv.AuthorAssociation),
	}
}

func (f *Forge) renderReviewComment(base string, rp *repo, c ReviewComment) *github.PullRequestComment {
	apiURL, htmlURL := pullURLs(base, rp, c.Number)
	out := &github.PullRequestComment{
		ID: github.Int64(c.ID), NodeID: github.String(fmt.Sprintf("PRRC_forge%d", c.ID)),
		PullRequestReviewID: github.Int64(c.ReviewID), Body: github.String(c.Body), Path: github.String(c.Path),
		Line: github.Int(c.Line), OriginalLine: github.Int(c.Line), Side: github.String(c.Side),
		CommitID: github.String(c.CommitID), OriginalCommitID: github.String(c.CommitID), SubjectType: github.String("line"),
		User: f.renderUser(base, c.User), CreatedAt: ts(c.CreatedAt), UpdatedAt: ts(c.CreatedAt),
		AuthorAssociation: github.String(c.AuthorAssociation),
		URL:               github.String(fmt.Sprintf("%s/repos/%s/pulls/comments/%d", base, rp.fullName(), c.ID)),
		HTMLURL:           github.String(fmt.Sprintf("%s#discussion_r%d", htmlURL, c.ID)),
		PullRequestURL:    github.String(apiURL),
	}
	if c.InReplyTo != 0 {
		out.InReplyTo = github.Int64(c.InReplyTo)
	}
	return out
}

func (f *Forge) renderIssueComment(base string, rp *repo, c IssueComment) *github.IssueComment {
	_, htmlURL := pullURLs(base, rp, c.Number)
	return &github.IssueComment{
		ID: github.Int64(c.ID), NodeID: github.String(fmt.Sprintf("IC_forge%d", c.ID)), Body: github.String(c.Body),
		User: f.renderUser(base, c.User), CreatedAt: ts(c.CreatedAt), UpdatedAt: ts(c.CreatedAt),
		AuthorAssociation: github.String(c.AuthorAssociation),
		URL:               github.String(fmt.Sprintf("%s/repos/%s/issues/comments/%d", base, rp.fullName(), c.ID)),
		HTMLURL:           github.String(fmt.Sprintf("%s#issuecomment-%d", htmlURL, c.ID)),
		IssueURL:          github.String(fmt.Sprintf("%s/repos/%s/issues/%d", base, rp.fullName(), c.Number)),
	}
}

// The two answers below carry a field GitHub sends and go-github v62 does not model. They are
// added by embedding go-github's type, never by building a map, so the rest cannot drift.

// tokenBody is the access_tokens answer: go-github's InstallationToken plus
// "repository_selection" ("all" or "selected").
type tokenBody struct {
	*github.InstallationToken
	RepositorySelection string `json:"repository_selection"`
}

// errorBody is GitHub's error answer: go-github's ErrorResponse plus the "status" GitHub sends
// (as a string) and go-github does not model.
type errorBody struct {
	github.ErrorResponse
	Status string `json:"status"`
}
