package githubtoken

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-github/v62/github"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/task"
)

// git runs git in dir with the token in an Authorization header (never in the URL). It
// returns stderr on failure; the caller never prints the command line, which holds the header.
func git(t *testing.T, dir, token string, args ...string) (string, error) {
	t.Helper()
	basic := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + token))
	full := append([]string{
		"-c", "http.extraHeader=Authorization: Basic " + basic,
		"-c", "user.name=runner", "-c", "user.email=runner@example.com",
		"-c", "init.defaultBranch=main", "-c", "credential.helper=",
	}, args...)
	cmd := exec.Command("git", full...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_ASKPASS=", "SSH_ASKPASS=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil {
		return stderr.String(), fmt.Errorf("git %s failed: %s", args[0], strings.ReplaceAll(stderr.String(), token, "[token]"))
	}
	return stderr.String(), nil
}

func TestIssueRepoTokenEndToEnd(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tk := h.newTask("acme/widgets", true)
	c := h.conn(tk.ID)

	resp, err := h.issue(c, tk.ID)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(resp.GetToken(), "ghs_"))
	require.Equal(t, "acme/widgets", resp.GetRepo())
	require.Equal(t, h.forgeTS.URL+"/", resp.GetApiBaseUrl())
	require.Equal(t, h.forgeTS.URL, resp.GetGitBaseUrl())
	require.Equal(t, h.clock.Now().Add(time.Hour), resp.GetExpireTime().AsTime())

	// The exact requests the forge received: installation lookup, then the token, both app
	// JWT authenticated, the token restricted to the one repository and three permissions.
	reqs := h.apiRequests()
	require.Len(t, reqs, 2)
	inst, ok := h.forge.InstallationID("acme")
	require.True(t, ok)
	now := float64(h.clock.Now().Unix())
	wantClaims := map[string]any{"iss": "4242", "iat": now - 60, "exp": now + 9*60}
	require.Equal(t, "GET", reqs[0].Method)
	require.Equal(t, "/repos/acme/widgets/installation", reqs[0].Path)
	require.Equal(t, http.StatusOK, reqs[0].Status)
	require.Equal(t, wantClaims, reqs[0].JWTClaims)
	require.Equal(t, "POST", reqs[1].Method)
	require.Equal(t, "/app/installations/"+strconv.FormatInt(inst, 10)+"/access_tokens", reqs[1].Path)
	require.Equal(t, http.StatusCreated, reqs[1].Status)
	require.Equal(t, wantClaims, reqs[1].JWTClaims)
	require.Equal(t, map[string]any{
		"repositories": []any{"widgets"},
		"permissions":  map[string]any{"contents": "write", "pull_requests": "write", "metadata": "read"},
	}, reqs[1].Body)

	// Real git over HTTP with the token in a header.
	work := t.TempDir()
	_, err = git(t, work, resp.GetToken(), "clone", resp.GetGitBaseUrl()+"/"+resp.GetRepo()+".git", "repo")
	require.NoError(t, err)
	repoDir := filepath.Join(work, "repo")
	readme, err := os.ReadFile(filepath.Join(repoDir, "README.md"))
	require.NoError(t, err)
	require.Equal(t, "# acme/widgets\n", string(readme))
	remote, err := exec.Command("git", "-C", repoDir, "remote", "get-url", "origin").Output()
	require.NoError(t, err)
	require.NotContains(t, string(remote), resp.GetToken(), "the token must not be in the remote URL")

	require.NoError(t, os.WriteFile(filepath.Join(repoDir, "change.txt"), []byte("hello\n"), 0o644))
	_, err = git(t, repoDir, resp.GetToken(), "add", "change.txt")
	require.NoError(t, err)
	_, err = git(t, repoDir, resp.GetToken(), "commit", "-q", "-m", "change")
	require.NoError(t, err)
	branch := task.HeadBranch(tk.ID)
	_, err = git(t, repoDir, resp.GetToken(), "push", "origin", "HEAD:refs/heads/"+branch)
	require.NoError(t, err)
	bare, ok := h.forge.RepoDir("acme", "widgets")
	require.True(t, ok)
	out, err := exec.Command("git", "--git-dir", bare, "rev-parse", "--verify", "refs/heads/"+branch).Output()
	require.NoError(t, err, "the pushed branch must exist on the forge")
	local, err := exec.Command("git", "-C", repoDir, "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	require.Equal(t, strings.TrimSpace(string(local)), strings.TrimSpace(string(out)))

	// The same token cannot push to another repository of the same installation.
	stderr, err := git(t, repoDir, resp.GetToken(), "push", h.forgeTS.URL+"/acme/other.git", "HEAD:refs/heads/"+branch)
	require.Error(t, err)
	require.Contains(t, stderr, "403")
	last := h.lastGit()
	require.Equal(t, "/acme/other.git/info/refs", last.Path)
	require.Equal(t, http.StatusForbidden, last.Status)

	// Once expired (forge clock), the token is refused with 401.
	h.clock.Advance(time.Hour + time.Second)
	stderr, err = git(t, work, resp.GetToken(), "clone", resp.GetGitBaseUrl()+"/"+resp.GetRepo()+".git", "again")
	require.Error(t, err)
	// git asks for other credentials after a 401 (prompts are disabled here).
	require.Contains(t, stderr, "could not read Username")
	require.Equal(t, http.StatusUnauthorized, h.lastGit().Status)
	require.Equal(t, "/acme/widgets.git/info/refs", h.lastGit().Path)
}

func TestTokenCache(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tk := h.newTask("acme/widgets", true)
	c := h.conn(tk.ID)

	first, err := h.issue(c, tk.ID)
	require.NoError(t, err)
	require.Len(t, h.apiRequests(), 2)

	// Second request: served from Redis, no forge call at all.
	second, err := h.issue(c, tk.ID)
	require.NoError(t, err)
	require.Equal(t, first.GetToken(), second.GetToken())
	require.Equal(t, first.GetExpireTime().AsTime(), second.GetExpireTime().AsTime())
	require.Len(t, h.apiRequests(), 2, "a cached token must not call the forge")

	// The cached value is neither in the key nor readable in Redis.
	keys, err := h.redis.Client.Keys(context.Background(), h.redis.Prefix+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 2)
	for _, k := range keys {
		require.NotContains(t, k, first.GetToken())
		v, err := h.redis.Client.Get(context.Background(), k).Result()
		require.NoError(t, err)
		require.NotContains(t, v, first.GetToken(), "the cached token must be encrypted")
	}

	// Still more than 5 minutes left: cached.
	h.clock.Advance(54 * time.Minute)
	third, err := h.issue(c, tk.ID)
	require.NoError(t, err)
	require.Equal(t, first.GetToken(), third.GetToken())
	require.Equal(t, 1, countPath(h.apiRequests(), "POST", "/access_tokens"))

	// Less than 5 minutes left: replaced by a new token.
	h.clock.Advance(2 * time.Minute)
	fourth, err := h.issue(c, tk.ID)
	require.NoError(t, err)
	require.NotEqual(t, first.GetToken(), fourth.GetToken())
	require.Equal(t, h.clock.Now().Add(time.Hour), fourth.GetExpireTime().AsTime())
	reqs := h.apiRequests()
	require.Equal(t, 2, countPath(reqs, "POST", "/access_tokens"))
	require.Equal(t, 1, countPath(reqs, "GET", "/installation"), "the installation lookup stays cached")
}

func TestConcurrentRequestsMakeOneCall(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	const n = 50
	clients := make([]taskrunnerv1.GitHubTokenServiceClient, n)
	ids := make([]string, n)
	for i := range n {
		tk := h.newTask("acme/widgets", i%2 == 0)
		ids[i], clients[i] = tk.ID, h.conn(tk.ID)
	}
	start := make(chan struct{})
	tokens := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := h.issue(clients[i], ids[i])
			errs[i] = err
			tokens[i] = resp.GetToken()
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, tokens[0], tokens[i])
	}
	reqs := h.apiRequests()
	require.Equal(t, 1, countPath(reqs, "POST", "/access_tokens"))
	require.Equal(t, 1, countPath(reqs, "GET", "/installation"))
	require.Len(t, reqs, 2)
}

func TestIssueRepoTokenAuthorization(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	a := h.newTask("acme/widgets", true)
	b := h.newTask("globex/gadgets", false) // proposing: live, not yet running
	done := h.newTask("acme/other", false)
	_, _, err := h.tasks.Advance(context.Background(), done.ID, "", task.Advance{Status: task.StatusCancelled, FailedReason: "stop"})
	require.NoError(t, err)

	tests := []struct {
		name     string
		certTask string // "" = no client certificate
		reqTask  string
		wantCode codes.Code
		wantRepo string
	}{
		{"task A gets A's repository", a.ID, a.ID, codes.OK, "acme/widgets"},
		{"task id may be omitted", a.ID, "", codes.OK, "acme/widgets"},
		{"task B gets B's repository", b.ID, b.ID, codes.OK, "globex/gadgets"},
		{"A's certificate asking for B", a.ID, b.ID, codes.PermissionDenied, ""},
		{"finished task", done.ID, done.ID, codes.PermissionDenied, ""},
		{"unknown task", "0b7f6a0e-4a49-4d6c-9d0e-6f0a8f2f1e11", "", codes.PermissionDenied, ""},
		{"no certificate", "", a.ID, codes.Unauthenticated, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.apiRequests())
			resp, err := h.issue(h.conn(tc.certTask), tc.reqTask)
			require.Equal(t, tc.wantCode, status.Code(err), "error: %v", err)
			if tc.wantCode != codes.OK {
				require.Nil(t, resp)
				require.Len(t, h.apiRequests(), before, "a refused request must not reach GitHub")
				return
			}
			require.Equal(t, tc.wantRepo, resp.GetRepo())
			// The token works on its repository and nowhere else.
			owner, name, _ := strings.Cut(tc.wantRepo, "/")
			gh := github.NewClient(nil).WithAuthToken(resp.GetToken())
			gh.BaseURL = h.srv.gh.base
			got, _, err := gh.Repositories.Get(context.Background(), owner, name)
			require.NoError(t, err)
			require.Equal(t, tc.wantRepo, got.GetFullName())
			_, r, err := gh.Repositories.Get(context.Background(), "acme", "other")
			require.Error(t, err)
			require.Equal(t, http.StatusForbidden, r.StatusCode)
			gh.Client().CloseIdleConnections()
		})
	}
	// A's and B's tokens were minted for their own repositories only.
	var minted []any
	for _, r := range h.apiRequests() {
		if r.Method == "POST" && strings.HasSuffix(r.Path, "/access_tokens") {
			minted = append(minted, r.Body.(map[string]any)["repositories"])
		}
	}
	require.Equal(t, []any{[]any{"widgets"}, []any{"gadgets"}}, minted)
}

func TestRepoAccess(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	c := h.conn("")
	internal := h.bearer(auth.ScopeInternal)
	inst, _ := h.forge.InstallationID("globex")
	acmeInst, _ := h.forge.InstallationID("acme")

	tests := []struct {
		name     string
		ctx      context.Context
		repo     string
		branch   string
		wantCode codes.Code
		want     *taskrunnerv1.RepoAccessResponse
	}{
		{"installed", internal, "globex/gadgets", "", codes.OK, &taskrunnerv1.RepoAccessResponse{Accessible: true, InstallationId: inst}},
		{"installed with branch", internal, "acme/widgets", "main", codes.OK, &taskrunnerv1.RepoAccessResponse{Accessible: true, InstallationId: acmeInst}},
		{"no such branch", internal, "acme/widgets", "release-9", codes.OK, &taskrunnerv1.RepoAccessResponse{InstallationId: acmeInst, Missing: MissingBranch}},
		{"not installed", internal, "nobody/nothing", "main", codes.OK, &taskrunnerv1.RepoAccessResponse{Missing: MissingInstallation}},
		{"bad name", internal, "not a repo", "", codes.InvalidArgument, nil},
		{"bad branch", internal, "acme/widgets", "a..b", codes.InvalidArgument, nil},
		{"tasks scope only", h.bearer(auth.ScopeTasks), "globex/gadgets", "", codes.PermissionDenied, nil},
		{"no bearer token", context.Background(), "globex/gadgets", "", codes.Unauthenticated, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.RepoAccess(tc.ctx, &taskrunnerv1.RepoAccessRequest{Repo: tc.repo, BaseBranch: tc.branch})
			require.Equal(t, tc.wantCode, status.Code(err), "error: %v", err)
			if tc.want != nil {
				require.Equal(t, tc.want.GetAccessible(), resp.GetAccessible())
				require.Equal(t, tc.want.GetInstallationId(), resp.GetInstallationId())
				require.Equal(t, tc.want.GetMissing(), resp.GetMissing())
			}
		})
	}
	// The branch was read with a token for the repository, never with the App's JWT.
	require.Equal(t, 2, countPath(h.apiRequests(), "GET", "/repos/acme/widgets/branches/main")+countPath(h.apiRequests(), "GET", "/repos/acme/widgets/branches/release-9"))
}

func TestAppNotInstalled(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tk := h.newTask("nobody/nothing", true)
	_, err := h.issue(h.conn(tk.ID), tk.ID)
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	require.Equal(t, "the GitHub App cannot access nobody/nothing: install it on the repository (or check that the repository exists)",
		status.Convert(err).Message())
	var reason string
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	require.Equal(t, ReasonRepoInaccessible, reason, "the runner tells this from a refused certificate by the reason")
}

func TestPersonalTokenMode(t *testing.T) {
	const pat = "ghp_personalTokenForLocalUse0123456789"
	h := newHarness(t, harnessOpts{personalToken: pat})
	tk := h.newTask("acme/widgets", true)
	resp, err := h.issue(h.conn(tk.ID), tk.ID)
	require.NoError(t, err)
	require.Equal(t, pat, resp.GetToken())
	require.Equal(t, "acme/widgets", resp.GetRepo())
	require.Empty(t, h.apiRequests(), "personal-token mode calls no App endpoint")

	work := t.TempDir()
	_, err = git(t, work, resp.GetToken(), "clone", resp.GetGitBaseUrl()+"/acme/widgets.git", "repo")
	require.NoError(t, err)

	ra, err := h.conn("").RepoAccess(h.bearer(auth.ScopeInternal), &taskrunnerv1.RepoAccessRequest{Repo: "acme/widgets"})
	require.NoError(t, err)
	require.True(t, ra.GetAccessible())
	reqs := h.apiRequests()
	require.Len(t, reqs, 1)
	require.Equal(t, "/repos/acme/widgets", reqs[0].Path)
	require.Equal(t, "personal", reqs[0].TokenID)

	// With a branch, and for what the token cannot read.
	srv := h.srv
	for _, tc := range []struct{ repo, branch, missing string }{
		{"acme/widgets", "main", ""},
		{"acme/widgets", "release-9", MissingBranch},
		{"nobody/nothing", "main", MissingRepository},
	} {
		ra, err := srv.CheckRepo(context.Background(), tc.repo, tc.branch)
		require.NoError(t, err)
		require.Equal(t, tc.missing == "", ra.GetAccessible(), "%s@%s", tc.repo, tc.branch)
		require.Equal(t, tc.missing, ra.GetMissing(), "%s@%s", tc.repo, tc.branch)
	}
}

func TestSanitize(t *testing.T) {
	const secret = "ghp_configuredSecret0123456789abcdef"
	g := &githubAPI{secret: []string{secret}}
	resp := &github.Response{Response: &http.Response{StatusCode: 422}}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"error response quoting a token", &github.ErrorResponse{Response: resp.Response, Message: "bad token ghs_abcdefghijklmnopqrstuvwxyz0123456789"},
			"github: mint: HTTP 422: bad token [REDACTED]"},
		{"configured secret", &github.ErrorResponse{Response: resp.Response, Message: "no " + secret},
			"github: mint: HTTP 422: no [REDACTED]"},
		{"transport error quoting a header", fmt.Errorf("proxy said Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxIn0.c2ln"),
			"github: mint: HTTP 422: proxy said Authorization: Bearer [REDACTED]"},
		{"timeout", context.DeadlineExceeded, "github: mint: timed out or cancelled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := g.sanitize("mint", resp, tc.err)
			require.Equal(t, tc.want, got.Error())
			require.False(t, errors.Is(got, tc.err) && tc.err != context.DeadlineExceeded, "the original error must not be reachable")
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"app mode", Config{AppID: "1", AppKeyFile: "/k.pem", TrustDomain: "td"}, ""},
		{"personal mode", Config{Token: "ghp_x", TrustDomain: "td"}, ""},
		{"no mode", Config{TrustDomain: "td"}, "TASKRUNNER_GITHUB_APP_ID (App mode) or TASKRUNNER_GITHUB_TOKEN"},
		{"both modes", Config{AppID: "1", AppKeyFile: "/k", Token: "ghp_secretvalue", TrustDomain: "td"}, "set one mode"},
		{"app without key", Config{AppID: "1", TrustDomain: "td"}, "TASKRUNNER_GITHUB_APP_KEY_FILE or TASKRUNNER_GITHUB_APP_KEY is required"},
		{"bad api url", Config{APIURL: "ftp://x", Token: "ghp_x", TrustDomain: "td"}, "TASKRUNNER_GITHUB_API_URL"},
		{"credentials in git url", Config{GitURL: "https://u:p@github.com", Token: "ghp_x", TrustDomain: "td"}, "TASKRUNNER_GITHUB_GIT_URL"},
		{"short cache key", Config{AppID: "1", AppKeyFile: "/k", CacheKey: "YWJj", TrustDomain: "td"}, "TASKRUNNER_GITHUB_CACHE_KEY"},
		{"no trust domain", Config{Token: "ghp_x"}, "TASKRUNNER_TRUST_DOMAIN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			require.NotContains(t, err.Error(), "ghp_secretvalue")
		})
	}
}
