package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-github/v62/github"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/services/task"
	"github.com/taskrunner/taskrunner/tools/forge"
)

// runs stands in for the follow-up RPC, which does not exist yet. It keeps the contract
// FollowUps documents: a request id is applied once. errs makes FollowUp fail for a task.
type runs struct {
	mu    sync.Mutex
	calls []followUpCall
	seen  map[string]bool
	errs  map[string]error
}

type followUpCall struct{ taskID, prompt, requestID string }

func (r *runs) FollowUp(_ context.Context, taskID, prompt, requestID, _, _ string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.errs[taskID]; err != nil {
		return false, err
	}
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	if r.seen[requestID] {
		return false, nil
	}
	r.seen[requestID] = true
	r.calls = append(r.calls, followUpCall{taskID, prompt, requestID})
	return true, nil
}

func (r *runs) Calls() []followUpCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]followUpCall(nil), r.calls...)
}

// forgeGitHub implements Permissions and PullRequests with go-github against the forge, the
// way services/githubtoken does against GitHub.
type forgeGitHub struct{ c *github.Client }

func splitRepo(full string) (string, string) {
	owner, name, _ := strings.Cut(full, "/")
	return owner, name
}

func (g *forgeGitHub) Permission(ctx context.Context, repo, login string) (string, error) {
	owner, name := splitRepo(repo)
	lvl, _, err := g.c.Repositories.GetPermissionLevel(ctx, owner, name, login)
	return lvl.GetPermission(), err
}

func (g *forgeGitHub) ReviewComments(ctx context.Context, repo string, number int, reviewID int64) ([]*github.PullRequestComment, error) {
	owner, name := splitRepo(repo)
	var all []*github.PullRequestComment
	opts := &github.ListOptions{PerPage: 100}
	for {
		page, resp, err := g.c.PullRequests.ListReviewComments(ctx, owner, name, number, reviewID, opts)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if resp.NextPage == 0 {
			return all, nil
		}
		opts.Page = resp.NextPage
	}
}

func (g *forgeGitHub) PullRequest(ctx context.Context, repo string, number int) (*github.PullRequest, error) {
	owner, name := splitRepo(repo)
	pr, _, err := g.c.PullRequests.Get(ctx, owner, name, number)
	return pr, err
}

// TestFollowUpsFromForge drives the forge as reviewers would; the forge's signed webhooks reach
// the receiver, which checks permissions and reads review comments on the forge through
// go-github, and asks for follow-ups.
func TestFollowUpsFromForge(t *testing.T) {
	rr := &runs{}
	gh := &forgeGitHub{}
	e := newEnv(t, WithFollowUps(FollowUpDeps{Runs: rr, Permissions: gh, PullRequests: gh}))
	f, fs := e.newForge(t)
	c := github.NewClient(nil).WithAuthToken(pat)
	var err error
	c.BaseURL, err = c.BaseURL.Parse(fs.URL + "/")
	require.NoError(t, err)
	gh.c = c
	require.NoError(t, f.SetCollaborator("acme/widgets", "alice", "write"))
	require.NoError(t, f.SetCollaborator("acme/widgets", "bob", "read"))

	ctx := context.Background()
	tk, _, err := e.store.Create(ctx, task.NewTask{Owner: "alice", Repo: "acme/widgets", BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	pushBranch(t, f, tk.HeadBranch)
	file := strings.ReplaceAll(tk.HeadBranch, "/", "-") + ".txt"
	var pr struct {
		Number  int64  `json:"number"`
		HTMLURL string `json:"html_url"`
	}
	forgeCall(t, fs.URL, pat, http.MethodPost, "/repos/acme/widgets/pulls", map[string]any{"title": "change", "head": tk.HeadBranch, "base": "main"}, http.StatusCreated, &pr)
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider) VALUES ($1, 'process')`, tk.ID)
	require.NoError(t, err)
	_, _, err = e.store.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "dispatch"})
	require.NoError(t, err)
	_, _, err = e.store.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusAwaitingReview, Seq: 1, PRURL: pr.HTMLURL, PRNumber: pr.Number})
	require.NoError(t, err)
	before := e.snapshot()

	// as posts to the forge's test-facing API as login and waits for the webhooks it causes
	// (n of them) to be answered; it returns those deliveries.
	delivered := 1 // "opened"
	as := func(login, path string, body map[string]any, n int) []forge.Delivery {
		t.Helper()
		want := http.StatusCreated // comments; GitHub answers a new review with 200
		if strings.HasSuffix(path, "/reviews") {
			want = http.StatusOK
		}
		forgeCall(t, fs.URL, "unused", http.MethodPost, "/_forge/as/"+login+"/repos/acme/widgets"+path, body, want, nil)
		delivered += n
		require.Eventually(t, func() bool {
			ds := f.Deliveries()
			return len(ds) == delivered && ds[len(ds)-1].StatusCode != 0
		}, 15*time.Second, 10*time.Millisecond)
		ds := f.Deliveries()
		return ds[len(ds)-n:]
	}
	number := fmt.Sprint(pr.Number)

	ds := as("alice", "/pulls/"+number+"/reviews", map[string]any{
		"event": "REQUEST_CHANGES", "body": "Please rename things.",
		"comments": []map[string]any{{"path": file, "line": 1, "body": "Say uno."}},
	}, 2)
	require.Equal(t, "pull_request_review_comment", ds[0].Event)
	require.Equal(t, http.StatusAccepted, ds[0].StatusCode)
	require.Equal(t, "pull_request_review", ds[1].Event)
	require.Equal(t, http.StatusOK, ds[1].StatusCode)
	require.Equal(t, []followUpCall{{
		taskID:    tk.ID,
		prompt:    "@alice requested changes on the pull request. Address the review on the same branch.\n\nReview:\n  Please rename things.\n\nComments on the code:\n- " + file + " line 1:\n  Say uno.\n",
		requestID: "github-delivery:" + ds[1].ID,
	}}, rr.Calls())

	ds = as("bob", "/pulls/"+number+"/reviews", map[string]any{"event": "REQUEST_CHANGES", "body": "Rewrite it all."}, 1)
	require.Equal(t, http.StatusAccepted, ds[0].StatusCode, "a reader is not obeyed")
	ds = as("alice", "/pulls/"+number+"/reviews", map[string]any{"event": "APPROVE"}, 1)
	require.Equal(t, http.StatusAccepted, ds[0].StatusCode, "an approval asks for nothing")
	ds = as("alice", "/issues/"+number+"/comments", map[string]any{"body": "Looks better."}, 1)
	require.Equal(t, http.StatusAccepted, ds[0].StatusCode, "no mention")
	require.Len(t, rr.Calls(), 1)

	ds = as("alice", "/issues/"+number+"/comments", map[string]any{"body": "@taskrunner also update the docs"}, 1)
	require.Equal(t, "issue_comment", ds[0].Event)
	require.Equal(t, http.StatusOK, ds[0].StatusCode)
	ds = as("alice", "/pulls/"+number+"/comments", map[string]any{"path": file, "line": 1, "body": "One more nit."}, 2)
	require.Equal(t, []int{http.StatusAccepted, http.StatusOK}, []int{ds[0].StatusCode, ds[1].StatusCode})
	calls := rr.Calls()
	require.Len(t, calls, 3)
	require.Equal(t, "@alice asked on the pull request:\n\n  @taskrunner also update the docs\n", calls[1].prompt)
	require.Equal(t, "@alice commented on the pull request. Address the review on the same branch.\n\nComments on the code:\n- "+file+" line 1:\n  One more nit.\n", calls[2].prompt)
	require.Equal(t, tk.ID, calls[2].taskID)
	require.Equal(t, before, e.snapshot(), "the receiver itself changes no row")
	require.NotContains(t, e.logs.String(), "Please rename things", "comment text is not logged")
}

// fakeGitHub answers for a repository without the forge, to make GitHub fail or answer what
// the forge cannot (a plain issue, an unreachable API).
type fakeGitHub struct {
	perms    map[string]string // login → permission; "flaky" fails
	heads    map[int]string    // pull request number → head branch
	comments []*github.PullRequestComment
}

func (g *fakeGitHub) Permission(_ context.Context, repo, login string) (string, error) {
	if login == "flaky" {
		return "", errors.New("github: get permission: HTTP 502")
	}
	if p, ok := g.perms[login]; ok {
		return p, nil
	}
	return "none", nil
}

func (g *fakeGitHub) ReviewComments(context.Context, string, int, int64) ([]*github.PullRequestComment, error) {
	return g.comments, nil
}

func (g *fakeGitHub) PullRequest(_ context.Context, repo string, number int) (*github.PullRequest, error) {
	head, ok := g.heads[number]
	if !ok {
		return nil, errors.New("github: get pull request: HTTP 502")
	}
	return &github.PullRequest{Number: github.Int(number), Head: &github.PullRequestBranch{Ref: github.String(head), Repo: &github.Repository{FullName: github.String(repo)}}}, nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

type reviewOpts struct {
	action, state, login, userType, repo, headRef, headRepo string
	number                                                  int
}

func reviewPayload(o reviewOpts) []byte {
	if o.action == "" {
		o.action = "submitted"
	}
	if o.userType == "" {
		o.userType = "User"
	}
	if o.headRepo == "" {
		o.headRepo = o.repo
	}
	user := &github.User{Login: github.String(o.login), Type: github.String(o.userType)}
	return mustJSON(&github.PullRequestReviewEvent{
		Action: github.String(o.action),
		Review: &github.PullRequestReview{ID: github.Int64(55), State: github.String(o.state), Body: github.String("Fix it."), User: user},
		PullRequest: &github.PullRequest{Number: github.Int(o.number),
			Head: &github.PullRequestBranch{Ref: github.String(o.headRef), Repo: &github.Repository{FullName: github.String(o.headRepo)}}},
		Repo: &github.Repository{FullName: github.String(o.repo)}, Sender: user,
	})
}

func issueCommentPayload(body, login, repo string, number int, onPR bool) []byte {
	issue := &github.Issue{Number: github.Int(number)}
	if onPR {
		issue.PullRequestLinks = &github.PullRequestLinks{URL: github.String("x")}
	}
	user := &github.User{Login: github.String(login), Type: github.String("User")}
	return mustJSON(&github.IssueCommentEvent{
		Action: github.String("created"), Issue: issue, Comment: &github.IssueComment{ID: github.Int64(9), Body: github.String(body), User: user},
		Repo: &github.Repository{FullName: github.String(repo)}, Sender: user,
	})
}

func TestFollowUpAnswers(t *testing.T) {
	rr := &runs{errs: map[string]error{}}
	gh := &fakeGitHub{perms: map[string]string{"alice": "write", "root": "admin", "bob": "read"}, heads: map[int]string{}}
	e := newEnv(t, WithFollowUps(FollowUpDeps{Runs: rr, Permissions: gh, PullRequests: gh}))
	tk := e.awaitingReview("acme/widgets", 7)
	refused := e.awaitingReview("acme/widgets", 8)
	down := e.awaitingReview("acme/widgets", 9)
	gh.heads[7], gh.heads[8] = tk.HeadBranch, refused.HeadBranch
	rr.errs[refused.ID] = status.Error(codes.FailedPrecondition, "task is done")
	rr.errs[down.ID] = status.Error(codes.Unavailable, "connection refused")
	gh.comments = []*github.PullRequestComment{{Path: github.String("a.go"), Line: github.Int(3), Body: github.String("Here.")}}
	other := task.HeadBranch("0b7f6a0e-4a49-4d6c-9d0e-6f0a8f2f1e11")

	review := func(o reviewOpts) []byte {
		if o.repo == "" {
			o.repo = "acme/widgets"
		}
		if o.headRef == "" {
			o.headRef = tk.HeadBranch
		}
		if o.number == 0 {
			o.number = 7
		}
		if o.state == "" {
			o.state = "changes_requested"
		}
		return reviewPayload(o)
	}
	tests := []struct {
		name     string
		d        delivery
		wantCode int
		wantRes  string // 2xx result or the error's ErrorInfo reason
		wantTask string
	}{
		{"review by a writer", signed("pull_request_review", "r1", review(reviewOpts{login: "alice"})), 200, "follow_up", tk.ID},
		{"the same delivery again", signed("pull_request_review", "r1", review(reviewOpts{login: "alice"})), 200, "duplicate", tk.ID},
		{"review by an admin, REST case", signed("pull_request_review", "r2", review(reviewOpts{login: "root", state: "COMMENTED"})), 200, "follow_up", tk.ID},
		{"review by a reader", signed("pull_request_review", "r3", review(reviewOpts{login: "bob"})), 202, "ignored", tk.ID},
		{"review by a stranger", signed("pull_request_review", "r4", review(reviewOpts{login: "eve"})), 202, "ignored", tk.ID},
		{"permission lookup fails", signed("pull_request_review", "r5", review(reviewOpts{login: "flaky"})), 503, "GITHUB_UNAVAILABLE", ""},
		{"review by a bot", signed("pull_request_review", "r6", review(reviewOpts{login: "forge[bot]", userType: "Bot"})), 202, "ignored", ""},
		{"approval", signed("pull_request_review", "r7", review(reviewOpts{login: "alice", state: "approved"})), 202, "ignored", ""},
		{"dismissed action", signed("pull_request_review", "r8", review(reviewOpts{login: "alice", action: "dismissed"})), 202, "ignored", ""},
		{"not a taskrunner branch", signed("pull_request_review", "r9", review(reviewOpts{login: "alice", headRef: "feature/x"})), 202, "ignored", ""},
		{"head branch in a fork", signed("pull_request_review", "r10", review(reviewOpts{login: "alice", headRepo: "mallory/widgets"})), 202, "ignored", tk.ID},
		{"repository is not the task's", signed("pull_request_review", "r11", review(reviewOpts{login: "alice", repo: "acme/other"})), 202, "ignored", tk.ID},
		{"another pull request number", signed("pull_request_review", "r12", review(reviewOpts{login: "alice", number: 8})), 202, "ignored", tk.ID},
		{"unknown task", signed("pull_request_review", "r13", review(reviewOpts{login: "alice", headRef: other})), 202, "ignored", other[len("taskrunner/"):]},
		{"follow-up refused", signed("pull_request_review", "r14", review(reviewOpts{login: "alice", headRef: refused.HeadBranch, number: 8})), 202, "ignored", refused.ID},
		{"task service down", signed("pull_request_review", "r15", review(reviewOpts{login: "alice", headRef: down.HeadBranch, number: 9})), 503, "TASK_SERVICE_UNAVAILABLE", ""},
		{"no delivery id", signed("pull_request_review", "", review(reviewOpts{login: "alice"})), 400, "BAD_DELIVERY_ID", ""},
		{"review payload without a review", signed("pull_request_review", "r16", []byte(`{"action":"submitted","repository":{"full_name":"acme/widgets"}}`)), 400, "BAD_PAYLOAD", ""},
		{"review comment", signed("pull_request_review_comment", "r17", mustJSON(&github.PullRequestReviewCommentEvent{Action: github.String("created"),
			Comment: &github.PullRequestComment{Body: github.String("@taskrunner x")}, PullRequest: &github.PullRequest{Number: github.Int(7)}, Repo: &github.Repository{FullName: github.String("acme/widgets")}})), 202, "ignored", ""},
		{"comment mentioning the handle", signed("issue_comment", "c1", issueCommentPayload("@taskrunner add tests", "alice", "acme/widgets", 7, true)), 200, "follow_up", tk.ID},
		{"comment without a mention", signed("issue_comment", "c2", issueCommentPayload("nice", "alice", "acme/widgets", 7, true)), 202, "ignored", ""},
		{"comment on an issue", signed("issue_comment", "c3", issueCommentPayload("@taskrunner add tests", "alice", "acme/widgets", 7, false)), 202, "ignored", ""},
		{"comment by a reader", signed("issue_comment", "c4", issueCommentPayload("@taskrunner add tests", "bob", "acme/widgets", 7, true)), 202, "ignored", tk.ID},
		{"pull request lookup fails", signed("issue_comment", "c5", issueCommentPayload("@taskrunner add tests", "alice", "acme/widgets", 99, true)), 503, "GITHUB_UNAVAILABLE", ""},
	}
	before := e.snapshot()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, r, ae := e.sendFull(tc.d)
			require.Equal(t, tc.wantCode, code)
			if code >= 400 {
				require.Equal(t, tc.wantRes, ae.reason())
				return
			}
			require.Equal(t, tc.wantRes, r.Result, r.Detail)
			require.Equal(t, tc.wantTask, r.TaskID)
		})
	}
	require.Equal(t, before, e.snapshot(), "no row may change")
	calls := rr.Calls()
	require.Len(t, calls, 3)
	require.Equal(t, followUpCall{tk.ID, "@alice requested changes on the pull request. Address the review on the same branch.\n\nReview:\n  Fix it.\n\nComments on the code:\n- a.go line 3:\n  Here.\n", "github-delivery:r1"}, calls[0])
	require.Equal(t, "github-delivery:r2", calls[1].requestID)
	require.Equal(t, followUpCall{tk.ID, "@alice asked on the pull request:\n\n  @taskrunner add tests\n", "github-delivery:c1"}, calls[2])
}

func TestFollowUpsNotEnabled(t *testing.T) {
	e := newEnv(t)
	tk := e.awaitingReview("acme/widgets", 7)
	for _, d := range []delivery{
		signed("pull_request_review", "n1", reviewPayload(reviewOpts{state: "changes_requested", login: "alice", repo: "acme/widgets", headRef: tk.HeadBranch, number: 7})),
		signed("issue_comment", "n2", issueCommentPayload("@taskrunner add tests", "alice", "acme/widgets", 7, true)),
	} {
		code, r := e.send(d)
		require.Equal(t, http.StatusAccepted, code)
		require.Equal(t, reply{Result: "ignored", Detail: "follow-ups are not enabled"}, r)
	}
	require.Contains(t, e.logs.String(), "follow-ups are not enabled")
}

func TestNewFollowUpDeps(t *testing.T) {
	tasks := storeReader{}
	_, err := New(Config{Secret: secret}, tasks, nil, WithFollowUps(FollowUpDeps{Runs: &runs{}}))
	require.ErrorContains(t, err, "Permissions")
	_, err = New(Config{Secret: secret}, tasks, nil, WithFollowUps(FollowUpDeps{Runs: &runs{}, Permissions: &fakeGitHub{}}))
	require.ErrorContains(t, err, "PullRequests")
	h, err := New(Config{Secret: secret}, tasks, nil, WithFollowUps(FollowUpDeps{}))
	require.NoError(t, err)
	require.False(t, h.followUpsEnabled())
	require.Equal(t, DefaultMention, h.cfg.Mention)

	require.ErrorContains(t, Config{Secret: secret, Mention: "taskrunner"}.Validate(), "TASKRUNNER_GITHUB_MENTION")
	require.ErrorContains(t, Config{Secret: secret, Mention: "@has space"}.Validate(), "TASKRUNNER_GITHUB_MENTION")
	require.NoError(t, Config{Secret: secret, Mention: "@my-bot"}.Validate())
}
