package forge

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-github/v62/github"
	"github.com/stretchr/testify/require"
)

// as returns a go-github client acting as login through /_forge/as/{login}/.
func (e *env) as(t *testing.T, login string) *github.Client {
	t.Helper()
	c := github.NewClient(e.srv.Client())
	u, err := c.BaseURL.Parse(e.srv.URL + "/_forge/as/" + login + "/")
	require.NoError(t, err)
	c.BaseURL = u
	return c
}

// openPR pushes branch with feature.txt (three lines) and opens a pull request as forge-user;
// it consumes the "opened" webhook and returns the pull request.
func (e *env) openPR(t *testing.T, branch string) *github.PullRequest {
	t.Helper()
	dir, out, err := e.clone(t, testPersonal, repoWidgets)
	require.NoError(t, err, out)
	commitBranch(t, dir, branch, map[string]string{"feature.txt": "one\ntwo\nthree\n"})
	out, err = push(t, dir, testPersonal, "origin", branch)
	require.NoError(t, err, out)
	pr, _, err := e.client(t, testPersonal, false).PullRequests.Create(context.Background(), owner1, repoWidgets,
		&github.NewPullRequest{Title: github.String("change " + branch), Head: github.String(branch), Base: github.String("main")})
	require.NoError(t, err)
	verifyHook(t, e.waitHook(t), "opened")
	return pr
}

// event checks a webhook the way a receiver does (go-github's ValidatePayload and ParseWebHook)
// and returns the parsed event.
func event(t *testing.T, h hook, wantEvent string) any {
	t.Helper()
	require.Equal(t, wantEvent, h.header.Get("X-GitHub-Event"))
	require.NotEmpty(t, h.header.Get("X-GitHub-Delivery"))
	req := httptest.NewRequest(http.MethodPost, "/hook", bytes.NewReader(h.body))
	req.Header = h.header.Clone()
	payload, err := github.ValidatePayload(req, []byte(testSecret))
	require.NoError(t, err)
	ev, err := github.ParseWebHook(wantEvent, payload)
	require.NoError(t, err)
	return ev
}

func TestReviews(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pr := e.openPR(t, "task-r")
	n := pr.GetNumber()
	require.NoError(t, e.f.SetCollaborator("acme/widgets", "alice", "write"))
	require.NoError(t, e.f.SetCollaborator("acme/widgets", "bob", "read"))
	alice := e.as(t, "alice")

	review, resp, err := alice.PullRequests.CreateReview(ctx, owner1, repoWidgets, n, &github.PullRequestReviewRequest{
		Body:  github.String("Please rename things."),
		Event: github.String("REQUEST_CHANGES"),
		Comments: []*github.DraftReviewComment{
			{Path: github.String("feature.txt"), Line: github.Int(1), Body: github.String("Say uno.")},
			{Path: github.String("feature.txt"), Line: github.Int(3), Side: github.String("RIGHT"), Body: github.String("And tres.")},
		},
	})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "CHANGES_REQUESTED", review.GetState())
	require.Equal(t, "alice", review.GetUser().GetLogin())
	require.Equal(t, "Please rename things.", review.GetBody())
	require.Equal(t, "COLLABORATOR", review.GetAuthorAssociation())
	require.Equal(t, pr.GetHead().GetSHA(), review.GetCommitID())
	require.Equal(t, "user:alice", e.lastAPIRequest(t).TokenID)

	// One pull_request_review_comment per comment, then the review.
	for _, want := range []struct {
		line int
		body string
	}{{1, "Say uno."}, {3, "And tres."}} {
		ev := event(t, e.waitHook(t), "pull_request_review_comment").(*github.PullRequestReviewCommentEvent)
		require.Equal(t, "created", ev.GetAction())
		require.Equal(t, "feature.txt", ev.GetComment().GetPath())
		require.Equal(t, want.line, ev.GetComment().GetLine())
		require.Equal(t, want.body, ev.GetComment().GetBody())
		require.Equal(t, review.GetID(), ev.GetComment().GetPullRequestReviewID())
		require.Equal(t, "alice", ev.GetSender().GetLogin())
		require.Equal(t, "task-r", ev.GetPullRequest().GetHead().GetRef())
	}
	rev := event(t, e.waitHook(t), "pull_request_review").(*github.PullRequestReviewEvent)
	require.Equal(t, "submitted", rev.GetAction())
	require.Equal(t, "changes_requested", rev.GetReview().GetState(), "webhooks carry the state in lower case, like GitHub")
	require.Equal(t, review.GetID(), rev.GetReview().GetID())
	require.Equal(t, "Please rename things.", rev.GetReview().GetBody())
	require.Equal(t, n, rev.GetPullRequest().GetNumber())
	require.Equal(t, "task-r", rev.GetPullRequest().GetHead().GetRef())
	require.Equal(t, "acme/widgets", rev.GetRepo().GetFullName())
	wantInst, _ := e.f.InstallationID(owner1)
	require.Equal(t, wantInst, rev.GetInstallation().GetID())
	require.Equal(t, "alice", rev.GetSender().GetLogin())
	require.Equal(t, "User", rev.GetSender().GetType())

	// A reader may approve; the token client reads everything back.
	approval, _, err := e.as(t, "bob").PullRequests.CreateReview(ctx, owner1, repoWidgets, n, &github.PullRequestReviewRequest{Event: github.String("APPROVE")})
	require.NoError(t, err)
	require.Equal(t, "APPROVED", approval.GetState())
	require.Equal(t, "approved", event(t, e.waitHook(t), "pull_request_review").(*github.PullRequestReviewEvent).GetReview().GetState())

	gh := e.client(t, e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{PullRequests: github.String("read")}), false)
	reviews, _, err := gh.PullRequests.ListReviews(ctx, owner1, repoWidgets, n, nil)
	require.NoError(t, err)
	require.Len(t, reviews, 2)
	require.Equal(t, []string{"CHANGES_REQUESTED", "APPROVED"}, []string{reviews[0].GetState(), reviews[1].GetState()})
	got, _, err := gh.PullRequests.GetReview(ctx, owner1, repoWidgets, n, review.GetID())
	require.NoError(t, err)
	require.Equal(t, "Please rename things.", got.GetBody())
	comments, _, err := gh.PullRequests.ListReviewComments(ctx, owner1, repoWidgets, n, review.GetID(), nil)
	require.NoError(t, err)
	require.Len(t, comments, 2)
	require.Equal(t, "Say uno.", comments[0].GetBody())
	require.Equal(t, 3, comments[1].GetLine())
	none, _, err := gh.PullRequests.ListReviewComments(ctx, owner1, repoWidgets, n, approval.GetID(), nil)
	require.NoError(t, err)
	require.Empty(t, none)
	_, resp, err = gh.PullRequests.GetReview(ctx, owner1, repoWidgets, n, 999999)
	require.Error(t, err)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	pull, _, err := gh.PullRequests.Get(ctx, owner1, repoWidgets, n)
	require.NoError(t, err)
	require.Equal(t, 2, pull.GetReviewComments())

	t.Run("refused", func(t *testing.T) {
		prRead := e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{PullRequests: github.String("read")})
		comment := func(path string, line int, side string) []*github.DraftReviewComment {
			return []*github.DraftReviewComment{{Path: github.String(path), Line: github.Int(line), Side: github.String(side), Body: github.String("x")}}
		}
		for _, tc := range []struct {
			name string
			c    *github.Client
			req  *github.PullRequestReviewRequest
			want int
		}{
			{"no event (pending)", alice, &github.PullRequestReviewRequest{Body: github.String("b")}, 422},
			{"unknown event", alice, &github.PullRequestReviewRequest{Event: github.String("REJECT"), Body: github.String("b")}, 422},
			{"request changes without body", alice, &github.PullRequestReviewRequest{Event: github.String("REQUEST_CHANGES")}, 422},
			{"comment without body or comments", alice, &github.PullRequestReviewRequest{Event: github.String("COMMENT")}, 422},
			{"file the PR does not change", alice, &github.PullRequestReviewRequest{Event: github.String("COMMENT"), Comments: comment("README.md", 1, "RIGHT")}, 422},
			{"line past the end", alice, &github.PullRequestReviewRequest{Event: github.String("COMMENT"), Comments: comment("feature.txt", 9, "RIGHT")}, 422},
			{"LEFT side of a new file", alice, &github.PullRequestReviewRequest{Event: github.String("COMMENT"), Comments: comment("feature.txt", 1, "LEFT")}, 422},
			{"no line", alice, &github.PullRequestReviewRequest{Event: github.String("COMMENT"), Comments: comment("feature.txt", 0, "RIGHT")}, 422},
			{"approve own pull request", e.client(t, testPersonal, false), &github.PullRequestReviewRequest{Event: github.String("APPROVE")}, 422},
			{"user without access", e.as(t, "mallory"), &github.PullRequestReviewRequest{Event: github.String("APPROVE")}, 403},
			{"token with pull_requests read", e.client(t, prRead, false), &github.PullRequestReviewRequest{Event: github.String("APPROVE")}, 403},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, resp, err := tc.c.PullRequests.CreateReview(ctx, owner1, repoWidgets, n, tc.req)
				var ghErr *github.ErrorResponse
				require.ErrorAs(t, err, &ghErr)
				require.Equal(t, tc.want, resp.StatusCode)
				require.Equal(t, docsURL, ghErr.DocumentationURL)
			})
		}
		_, resp, err := alice.PullRequests.CreateReview(ctx, owner1, repoWidgets, 99, &github.PullRequestReviewRequest{Event: github.String("APPROVE")})
		require.Error(t, err)
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		all, _, err := gh.PullRequests.ListReviews(ctx, owner1, repoWidgets, n, nil)
		require.NoError(t, err)
		require.Len(t, all, 2, "a refused review is not stored")
	})
}

func TestReviewCommentOnItsOwn(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	n := e.openPR(t, "task-c").GetNumber()
	require.NoError(t, e.f.SetCollaborator("acme/widgets", "alice", "maintain"))
	alice := e.as(t, "alice")

	c, resp, err := alice.PullRequests.CreateComment(ctx, owner1, repoWidgets, n, &github.PullRequestComment{
		Body: github.String("Typo here."), Path: github.String("feature.txt"), Line: github.Int(2), Side: github.String("RIGHT"),
	})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 2, c.GetLine())
	require.NotZero(t, c.GetPullRequestReviewID())

	ce := event(t, e.waitHook(t), "pull_request_review_comment").(*github.PullRequestReviewCommentEvent)
	require.Equal(t, c.GetID(), ce.GetComment().GetID())
	// GitHub files a lone comment under a COMMENTED review with an empty body and says so.
	re := event(t, e.waitHook(t), "pull_request_review").(*github.PullRequestReviewEvent)
	require.Equal(t, c.GetPullRequestReviewID(), re.GetReview().GetID())
	require.Equal(t, "commented", re.GetReview().GetState())
	require.Empty(t, re.GetReview().GetBody())

	reply, _, err := alice.PullRequests.CreateCommentInReplyTo(ctx, owner1, repoWidgets, n, "Fixed?", c.GetID())
	require.NoError(t, err)
	require.Equal(t, c.GetID(), reply.GetInReplyTo())
	require.Equal(t, "feature.txt", reply.GetPath())
	require.Equal(t, 2, reply.GetLine())
	event(t, e.waitHook(t), "pull_request_review_comment")
	event(t, e.waitHook(t), "pull_request_review")

	all, _, err := e.client(t, testPersonal, false).PullRequests.ListComments(ctx, owner1, repoWidgets, n, nil)
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, []string{"Typo here.", "Fixed?"}, []string{all[0].GetBody(), all[1].GetBody()})

	_, resp, err = alice.PullRequests.CreateCommentInReplyTo(ctx, owner1, repoWidgets, n, "to nothing", 424242)
	require.Error(t, err)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	_, resp, err = alice.PullRequests.CreateComment(ctx, owner1, repoWidgets, n, &github.PullRequestComment{Body: github.String("x"), Path: github.String("nope.txt"), Line: github.Int(1)})
	require.Error(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
}

func TestIssueComments(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	n := e.openPR(t, "task-i").GetNumber()
	require.NoError(t, e.f.SetCollaborator("acme/widgets", "bob", "triage"))

	c, resp, err := e.as(t, "bob").Issues.CreateComment(ctx, owner1, repoWidgets, n, &github.IssueComment{Body: github.String("@taskrunner add a test")})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "bob", c.GetUser().GetLogin())
	require.Equal(t, "COLLABORATOR", c.GetAuthorAssociation())

	ev := event(t, e.waitHook(t), "issue_comment").(*github.IssueCommentEvent)
	require.Equal(t, "created", ev.GetAction())
	require.Equal(t, "@taskrunner add a test", ev.GetComment().GetBody())
	require.Equal(t, n, ev.GetIssue().GetNumber())
	require.True(t, ev.GetIssue().IsPullRequest(), "a comment on a pull request names it")
	require.Equal(t, e.srv.URL+"/acme/widgets/pull/1", ev.GetIssue().GetPullRequestLinks().GetHTMLURL())
	require.Equal(t, "bob", ev.GetSender().GetLogin())

	issuesOnly := e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{Issues: github.String("write")})
	_, _, err = e.client(t, issuesOnly, false).Issues.CreateComment(ctx, owner1, repoWidgets, n, &github.IssueComment{Body: github.String("bot says hi")})
	require.NoError(t, err)
	bot := event(t, e.waitHook(t), "issue_comment").(*github.IssueCommentEvent)
	require.Equal(t, "forge[bot]", bot.GetSender().GetLogin())
	require.Equal(t, "Bot", bot.GetSender().GetType())

	list, _, err := e.client(t, testPersonal, false).Issues.ListComments(ctx, owner1, repoWidgets, n, nil)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "bot says hi", list[1].GetBody())
	pull, _, err := e.client(t, testPersonal, false).PullRequests.Get(ctx, owner1, repoWidgets, n)
	require.NoError(t, err)
	require.Equal(t, 2, pull.GetComments())

	contentsOnly := e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{Contents: github.String("write")})
	for _, tc := range []struct {
		name   string
		c      *github.Client
		number int
		body   string
		want   int
	}{
		{"no such pull request", e.client(t, testPersonal, false), 7, "x", 404},
		{"empty body", e.client(t, testPersonal, false), n, " ", 422},
		{"token without issues or pull_requests", e.client(t, contentsOnly, false), n, "x", 403},
		{"user without access", e.as(t, "mallory"), n, "x", 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, resp, err := tc.c.Issues.CreateComment(ctx, owner1, repoWidgets, tc.number, &github.IssueComment{Body: github.String(tc.body)})
			require.Error(t, err)
			require.Equal(t, tc.want, resp.StatusCode)
		})
	}
}

func TestCollaboratorPermission(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	put := func(t *testing.T, path, body string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, e.srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	require.Equal(t, http.StatusNoContent, put(t, "/_forge/repos/acme/widgets/collaborators/carol", `{"permission":"admin"}`))
	require.Equal(t, http.StatusNoContent, put(t, "/_forge/repos/acme/widgets/collaborators/dave", ``), "default role write")
	require.Equal(t, http.StatusUnprocessableEntity, put(t, "/_forge/repos/acme/widgets/collaborators/erin", `{"permission":"owner"}`))
	require.Equal(t, http.StatusNotFound, put(t, "/_forge/repos/acme/nothing/collaborators/erin", `{"permission":"read"}`))
	for login, role := range map[string]string{"mia": "maintain", "tom": "triage", "rita": "read", "gone": "write"} {
		require.NoError(t, e.f.SetCollaborator("acme/widgets", login, role))
	}
	require.NoError(t, e.f.SetCollaborator("acme/widgets", "gone", "none"))
	require.Error(t, e.f.SetCollaborator("acme/nothing", "x", "read"))
	require.Error(t, e.f.SetCollaborator("acme/widgets", "bad login!", "read"))

	gh := e.client(t, e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{Metadata: github.String("read")}), false)
	for _, tc := range []struct{ login, want string }{
		{"carol", "admin"}, {"dave", "write"}, {"mia", "write"}, {"tom", "read"}, {"rita", "read"},
		{"gone", "none"}, {"stranger", "none"}, {"erin", "none"}, {"forge-user", "admin"}, {"CAROL", "admin"},
	} {
		t.Run(tc.login, func(t *testing.T) {
			lvl, resp, err := gh.Repositories.GetPermissionLevel(ctx, owner1, repoWidgets, tc.login)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, tc.want, lvl.GetPermission())
			require.Equal(t, tc.login, lvl.GetUser().GetLogin())
		})
	}
	// Collaborators are per repository.
	lvl, _, err := e.client(t, testPersonal, false).Repositories.GetPermissionLevel(ctx, owner1, repoGadgets, "carol")
	require.NoError(t, err)
	require.Equal(t, "none", lvl.GetPermission())
	_, resp, err := e.client(t, "", false).Repositories.GetPermissionLevel(ctx, owner1, repoWidgets, "carol")
	require.Error(t, err)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestCloseAndMergeAsUser(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first := e.openPR(t, "task-x").GetNumber()
	second := e.openPR(t, "task-y").GetNumber()
	require.NoError(t, e.f.SetCollaborator("acme/widgets", "alice", "write"))
	require.NoError(t, e.f.SetCollaborator("acme/widgets", "bob", "read"))

	_, resp, err := e.as(t, "bob").PullRequests.Edit(ctx, owner1, repoWidgets, first, &github.PullRequest{State: github.String("closed")})
	require.Error(t, err)
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a reader cannot close")

	closed, _, err := e.as(t, "alice").PullRequests.Edit(ctx, owner1, repoWidgets, first, &github.PullRequest{State: github.String("closed")})
	require.NoError(t, err)
	require.Equal(t, "closed", closed.GetState())
	ev := verifyHook(t, e.waitHook(t), "closed")
	require.False(t, ev.GetPullRequest().GetMerged())
	require.Equal(t, "alice", ev.GetSender().GetLogin())

	_, resp, err = e.as(t, "bob").PullRequests.Merge(ctx, owner1, repoWidgets, second, "", nil)
	require.Error(t, err)
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a reader cannot merge")
	res, _, err := e.as(t, "alice").PullRequests.Merge(ctx, owner1, repoWidgets, second, "", nil)
	require.NoError(t, err)
	require.True(t, res.GetMerged())
	ev = verifyHook(t, e.waitHook(t), "closed")
	require.True(t, ev.GetPullRequest().GetMerged())
	require.Equal(t, "alice", ev.GetPullRequest().GetMergedBy().GetLogin())
	require.Equal(t, "alice", ev.GetSender().GetLogin())

	// The enterprise prefix works behind /_forge/as/ too, and a bad login is not a route.
	c, err := github.NewClient(e.srv.Client()).WithEnterpriseURLs(e.srv.URL+"/_forge/as/alice", e.srv.URL)
	require.NoError(t, err)
	got, _, err := c.PullRequests.Get(ctx, owner1, repoWidgets, second)
	require.NoError(t, err)
	require.True(t, got.GetMerged())
	_, resp, err = e.as(t, "-bad").PullRequests.Get(ctx, owner1, repoWidgets, second)
	require.Error(t, err)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}
