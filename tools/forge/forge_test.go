package forge

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-github/v62/github"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testAppID     = 42
	testSecret    = "hook-secret"
	testPersonal  = "personal-token-text"
	owner1        = "acme"
	repoWidgets   = "widgets"
	repoGadgets   = "gadgets"
	hookWaitLimit = 10 * time.Second
)

// keys are generated once: RSA generation is the slowest part of setting up a forge.
var keys = sync.OnceValue(func() [2]*rsa.PrivateKey {
	var out [2]*rsa.PrivateKey
	for i := range out {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		out[i] = k
	}
	return out
})

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type hook struct {
	header http.Header
	body   []byte
}

type env struct {
	f     *Forge
	srv   *httptest.Server
	clock *fakeClock
	key   *rsa.PrivateKey
	hooks chan hook
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{
		clock: &fakeClock{now: time.Now().UTC().Truncate(time.Second)},
		key:   keys()[0],
		hooks: make(chan hook, 32),
	}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// Keep the request's own body readable for github.ValidatePayload.
		r.Body = io.NopCloser(bytes.NewReader(body))
		e.hooks <- hook{header: r.Header.Clone(), body: body}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	f, err := New(Config{
		DataDir:       t.TempDir(),
		AppID:         testAppID,
		ClientID:      "Iv1.testclient",
		AppPublicKey:  &e.key.PublicKey,
		PersonalToken: testPersonal,
		WebhookURL:    receiver.URL + "/hook",
		WebhookSecret: testSecret,
		Now:           e.clock.Now,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	e.f = f
	require.NoError(t, f.CreateRepo(owner1, repoWidgets, map[string]string{"README.md": "# widgets\n", "src/main.go": "package main\n"}))
	require.NoError(t, f.CreateRepo(owner1, repoGadgets, map[string]string{"README.md": "# gadgets\n"}))
	e.srv = httptest.NewServer(f.Handler())
	t.Cleanup(e.srv.Close)
	return e
}

// client returns a go-github client; enterprise selects the /api/v3/ prefix.
func (e *env) client(t *testing.T, token string, enterprise bool) *github.Client {
	t.Helper()
	c := github.NewClient(e.srv.Client())
	if enterprise {
		var err error
		c, err = c.WithEnterpriseURLs(e.srv.URL, e.srv.URL)
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(c.BaseURL.Path, "/api/v3/"))
	} else {
		u, err := c.BaseURL.Parse(e.srv.URL + "/")
		require.NoError(t, err)
		c.BaseURL = u
	}
	if token != "" {
		c = c.WithAuthToken(token)
	}
	return c
}

func (e *env) signJWT(t *testing.T, key *rsa.PrivateKey, method jwt.SigningMethod, claims jwt.MapClaims) string {
	t.Helper()
	var signKey any = key
	if method == jwt.SigningMethodHS256 {
		signKey = []byte("not-an-rsa-key")
	}
	s, err := jwt.NewWithClaims(method, claims).SignedString(signKey)
	require.NoError(t, err)
	return s
}

// appJWT is a JWT as GitHub documents it: iat backdated 60 s, exp within 10 minutes, iss = app id.
func (e *env) appJWT(t *testing.T) string {
	now := e.clock.Now()
	return e.signJWT(t, e.key, jwt.SigningMethodRS256, jwt.MapClaims{
		"iat": now.Add(-60 * time.Second).Unix(), "exp": now.Add(9 * time.Minute).Unix(), "iss": strconv.Itoa(testAppID),
	})
}

// installationToken mints a token over REST, the real path.
func (e *env) installationToken(t *testing.T, repos []string, perms *github.InstallationPermissions) string {
	t.Helper()
	ctx := context.Background()
	app := e.client(t, e.appJWT(t), false)
	inst, _, err := app.Apps.FindRepositoryInstallation(ctx, owner1, repoWidgets)
	require.NoError(t, err)
	tok, resp, err := app.Apps.CreateInstallationToken(ctx, inst.GetID(), &github.InstallationTokenOptions{Repositories: repos, Permissions: perms})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	return tok.GetToken()
}

func (e *env) lastAPIRequest(t *testing.T) Request {
	t.Helper()
	reqs := e.f.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].Kind == "api" {
			return reqs[i]
		}
	}
	t.Fatal("no API request recorded")
	return Request{}
}

func (e *env) waitHook(t *testing.T) hook {
	t.Helper()
	select {
	case h := <-e.hooks:
		return h
	case <-time.After(hookWaitLimit):
		t.Fatal("no webhook arrived")
		return hook{}
	}
}

func writePerms() *github.InstallationPermissions {
	return &github.InstallationPermissions{Contents: github.String("write"), PullRequests: github.String("write"), Metadata: github.String("read")}
}

func TestAppInstallationToken(t *testing.T) {
	for _, tc := range []struct {
		name       string
		enterprise bool
	}{{"root base URL", false}, {"enterprise /api/v3/ base URL", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			jwtText := e.appJWT(t)
			app := e.client(t, jwtText, tc.enterprise)

			inst, resp, err := app.Apps.FindRepositoryInstallation(ctx, owner1, repoWidgets)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			wantID, ok := e.f.InstallationID(owner1)
			require.True(t, ok)
			require.Equal(t, wantID, inst.GetID())
			require.Equal(t, owner1, inst.GetAccount().GetLogin())
			require.Equal(t, int64(testAppID), inst.GetAppID())

			rec := e.lastAPIRequest(t)
			require.Equal(t, "GET", rec.Method)
			require.Equal(t, "/repos/acme/widgets/installation", rec.Path)
			require.Equal(t, "42", rec.JWTClaims["iss"])
			require.Equal(t, http.StatusOK, rec.Status)

			tok, resp, err := app.Apps.CreateInstallationToken(ctx, inst.GetID(), &github.InstallationTokenOptions{
				Repositories: []string{repoWidgets},
				Permissions:  writePerms(),
			})
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.True(t, strings.HasPrefix(tok.GetToken(), "ghs_"))
			require.True(t, tok.GetExpiresAt().Time.Equal(e.clock.Now().Add(time.Hour)), "expires_at %v", tok.GetExpiresAt())
			require.Equal(t, "write", tok.GetPermissions().GetContents())
			require.Equal(t, "write", tok.GetPermissions().GetPullRequests())
			require.Equal(t, "read", tok.GetPermissions().GetMetadata())
			require.Empty(t, tok.GetPermissions().GetIssues())
			require.Len(t, tok.Repositories, 1)
			require.Equal(t, "acme/widgets", tok.Repositories[0].GetFullName())

			rec = e.lastAPIRequest(t)
			require.Equal(t, "POST", rec.Method)
			require.Equal(t, "/app/installations/"+strconv.FormatInt(wantID, 10)+"/access_tokens", rec.Path)
			require.Equal(t, http.StatusCreated, rec.Status)
			require.Equal(t, "42", rec.JWTClaims["iss"])
			require.EqualValues(t, e.clock.Now().Add(-60*time.Second).Unix(), rec.JWTClaims["iat"])
			require.Equal(t, map[string]any{
				"repositories": []any{"widgets"},
				"permissions":  map[string]any{"contents": "write", "pull_requests": "write", "metadata": "read"},
			}, rec.Body)
			require.NotEmpty(t, rec.IssuedTokenID)
			require.Empty(t, rec.TokenID)

			// The token text is never recorded.
			all, err := json.Marshal(e.f.Requests())
			require.NoError(t, err)
			require.NotContains(t, string(all), tok.GetToken())
		})
	}
}

func TestAppJWTVerification(t *testing.T) {
	e := newEnv(t)
	now := e.clock.Now()
	iat, exp := now.Add(-60*time.Second).Unix(), now.Add(9*time.Minute).Unix()
	other := keys()[1]
	for _, tc := range []struct {
		name   string
		key    *rsa.PrivateKey
		method jwt.SigningMethod
		claims jwt.MapClaims
		want   int
	}{
		{"valid, iss app id string", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"iat": iat, "exp": exp, "iss": "42"}, 200},
		{"valid, iss app id number", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"iat": iat, "exp": exp, "iss": 42}, 200},
		{"valid, iss client id", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"iat": iat, "exp": exp, "iss": "Iv1.testclient"}, 200},
		{"bad signature", other, jwt.SigningMethodRS256, jwt.MapClaims{"iat": iat, "exp": exp, "iss": "42"}, 401},
		{"HS256", nil, jwt.SigningMethodHS256, jwt.MapClaims{"iat": iat, "exp": exp, "iss": "42"}, 401},
		{"expired", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"iat": now.Add(-11 * time.Minute).Unix(), "exp": now.Add(-time.Minute).Unix(), "iss": "42"}, 401},
		{"exp more than 10 minutes after iat", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"iat": iat, "exp": now.Add(15 * time.Minute).Unix(), "iss": "42"}, 401},
		{"iat in the future", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"iat": now.Add(2 * time.Minute).Unix(), "exp": exp, "iss": "42"}, 401},
		{"no iat", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"exp": exp, "iss": "42"}, 401},
		{"no exp", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"iat": iat, "iss": "42"}, 401},
		{"wrong issuer", e.key, jwt.SigningMethodRS256, jwt.MapClaims{"iat": iat, "exp": exp, "iss": "43"}, 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := e.client(t, e.signJWT(t, tc.key, tc.method, tc.claims), false)
			_, resp, err := app.Apps.FindRepositoryInstallation(context.Background(), owner1, repoWidgets)
			require.Equal(t, tc.want, resp.StatusCode)
			rec := e.lastAPIRequest(t)
			require.Equal(t, tc.want, rec.Status)
			if tc.want == 200 {
				require.NoError(t, err)
				require.NotNil(t, rec.JWTClaims)
				return
			}
			var ghErr *github.ErrorResponse
			require.ErrorAs(t, err, &ghErr)
			require.NotEmpty(t, ghErr.Message)
			require.Equal(t, docsURL, ghErr.DocumentationURL)
			require.Nil(t, rec.JWTClaims)
		})
	}

	t.Run("SignAppJWT helper", func(t *testing.T) {
		signed, err := SignAppJWT(e.key, "Iv1.testclient", e.clock.Now())
		require.NoError(t, err)
		inst, _, err := e.client(t, signed, false).Apps.FindRepositoryInstallation(context.Background(), owner1, repoWidgets)
		require.NoError(t, err)
		require.Equal(t, owner1, inst.GetAccount().GetLogin())
		require.Equal(t, "Iv1.testclient", e.lastAPIRequest(t).JWTClaims["iss"])
	})
	t.Run("an installation token is not an app JWT", func(t *testing.T) {
		tok := e.installationToken(t, nil, nil)
		_, resp, err := e.client(t, tok, false).Apps.FindRepositoryInstallation(context.Background(), owner1, repoWidgets)
		require.Error(t, err)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	})
	t.Run("unknown repository has no installation", func(t *testing.T) {
		_, resp, err := e.client(t, e.appJWT(t), false).Apps.FindRepositoryInstallation(context.Background(), "nobody", "nothing")
		require.Error(t, err)
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
	})
}

func TestInstallationTokenRequests(t *testing.T) {
	e := newEnv(t)
	instID, _ := e.f.InstallationID(owner1)
	app := e.client(t, e.appJWT(t), false)
	for _, tc := range []struct {
		name      string
		id        int64
		opts      *github.InstallationTokenOptions
		want      int
		selection string
		repos     int
	}{
		{"no body: all repositories", instID, nil, 201, "all", 0},
		{"by repository name", instID, &github.InstallationTokenOptions{Repositories: []string{repoGadgets}}, 201, "selected", 1},
		{"unknown repository", instID, &github.InstallationTokenOptions{Repositories: []string{"nope"}}, 422, "", 0},
		{"permission above the installation", instID, &github.InstallationTokenOptions{Permissions: &github.InstallationPermissions{Administration: github.String("write")}}, 422, "", 0},
		{"unknown installation", instID + 1000, nil, 404, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, resp, err := app.Apps.CreateInstallationToken(context.Background(), tc.id, tc.opts)
			require.Equal(t, tc.want, resp.StatusCode)
			if tc.want != 201 {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Len(t, tok.Repositories, tc.repos)
			if tc.selection == "all" {
				require.Nil(t, tok.Repositories)
			}
		})
	}
}

func TestRepoEndpointAuth(t *testing.T) {
	e := newEnv(t)
	full := e.installationToken(t, []string{repoWidgets}, writePerms())
	gadgetsOnly := e.installationToken(t, []string{repoGadgets}, writePerms())
	metadataOnly := e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{Metadata: github.String("read")})
	prRead := e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{PullRequests: github.String("read")})
	for _, tc := range []struct {
		name   string
		token  string
		repo   string
		action string // "get" repo, "list" pulls, "create" pull
		want   int
	}{
		{"no token", "", repoWidgets, "get", 401},
		{"unknown token", "ghs_unknown", repoWidgets, "get", 401},
		{"installation token", full, repoWidgets, "get", 200},
		{"enterprise path", full, repoWidgets, "get-enterprise", 200},
		{"personal token", testPersonal, repoWidgets, "get", 200},
		{"unknown repo", full, "nope", "get", 404},
		{"out of scope repo", gadgetsOnly, repoWidgets, "get", 403},
		{"metadata only lists pulls", metadataOnly, repoWidgets, "list", 403},
		{"pull_requests read lists pulls", prRead, repoWidgets, "list", 200},
		{"pull_requests read cannot create", prRead, repoWidgets, "create", 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := e.client(t, tc.token, tc.action == "get-enterprise")
			var resp *github.Response
			var err error
			switch tc.action {
			case "get", "get-enterprise":
				var r *github.Repository
				r, resp, err = c.Repositories.Get(ctx, owner1, tc.repo)
				if tc.want == 200 {
					require.Equal(t, "main", r.GetDefaultBranch())
					require.Equal(t, "acme/widgets", r.GetFullName())
					require.Equal(t, e.srv.URL+"/acme/widgets.git", r.GetCloneURL())
				}
			case "list":
				_, resp, err = c.PullRequests.List(ctx, owner1, tc.repo, nil)
			case "create":
				_, resp, err = c.PullRequests.Create(ctx, owner1, tc.repo, &github.NewPullRequest{Title: github.String("x"), Head: github.String("main"), Base: github.String("main")})
			}
			require.Equal(t, tc.want, resp.StatusCode)
			if tc.want == 200 {
				require.NoError(t, err)
				return
			}
			var ghErr *github.ErrorResponse
			require.ErrorAs(t, err, &ghErr)
			require.NotEmpty(t, ghErr.Message)
			require.Equal(t, docsURL, ghErr.DocumentationURL)
		})
	}

	t.Run("expired token", func(t *testing.T) {
		e.clock.Advance(time.Hour)
		_, resp, err := e.client(t, full, false).Repositories.Get(context.Background(), owner1, repoWidgets)
		require.Error(t, err)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	})
}

// git runs the real git CLI isolated from the user's configuration.
func git(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+os.DevNull, "GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=", "SSH_ASKPASS=", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func mustGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := git(t, dir, args...)
	require.NoError(t, err, "git %v: %s", args, out)
	return out
}

func authHeader(token string) string {
	return "http.extraHeader=Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+token))
}

// clone clones repo with token sent as an extra header (never in the URL).
func (e *env) clone(t *testing.T, token, repo string) (string, string, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), repo)
	out, err := git(t, "", "-c", authHeader(token), "clone", "--quiet", e.srv.URL+"/"+owner1+"/"+repo+".git", dir)
	return dir, out, err
}

// commitBranch creates branch in the clone at dir with one commit adding files.
func commitBranch(t *testing.T, dir, branch string, files map[string]string) string {
	t.Helper()
	mustGit(t, dir, "checkout", "--quiet", "-b", branch)
	for name, content := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	mustGit(t, dir, "add", "-A")
	mustGit(t, dir, "-c", "user.name=tester", "-c", "user.email=tester@example.invalid", "commit", "--quiet", "-m", "change on "+branch)
	return mustGit(t, dir, "rev-parse", "HEAD")
}

func push(t *testing.T, dir, token, remote, branch string) (string, error) {
	t.Helper()
	return git(t, dir, "-c", authHeader(token), "push", "--quiet", remote, branch+":"+branch)
}

func (e *env) bareSHA(t *testing.T, repo, ref string) string {
	t.Helper()
	dir, ok := e.f.RepoDir(owner1, repo)
	require.True(t, ok)
	out, err := git(t, "", "--git-dir="+dir, "rev-parse", "--verify", "--quiet", ref)
	if err != nil {
		return ""
	}
	return out
}

func TestGitSmartHTTP(t *testing.T) {
	e := newEnv(t)
	writer := e.installationToken(t, []string{repoWidgets}, writePerms())
	reader := e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{Contents: github.String("read")})
	noContents := e.installationToken(t, []string{repoWidgets}, &github.InstallationPermissions{PullRequests: github.String("write")})

	dir, out, err := e.clone(t, writer, repoWidgets)
	require.NoError(t, err, out)
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	require.NoError(t, err)
	require.Equal(t, "# widgets\n", string(readme))
	require.Equal(t, "forge", mustGit(t, dir, "log", "-1", "--format=%cn"))

	sha := commitBranch(t, dir, "feature", map[string]string{"feature.txt": "new\n"})
	out, err = push(t, dir, writer, "origin", "feature")
	require.NoError(t, err, out)
	require.Equal(t, sha, e.bareSHA(t, repoWidgets, "refs/heads/feature"))

	t.Run("large push uses a chunked request body", func(t *testing.T) {
		blob := make([]byte, 3<<20) // incompressible and above git's 1 MiB http.postBuffer
		_, err := rand.Read(blob)
		require.NoError(t, err)
		bdir, out, err := e.clone(t, writer, repoWidgets)
		require.NoError(t, err, out)
		sha := commitBranch(t, bdir, "big", map[string]string{"blob.bin": string(blob)})
		out, err = push(t, bdir, writer, "origin", "big")
		require.NoError(t, err, out)
		require.Equal(t, sha, e.bareSHA(t, repoWidgets, "refs/heads/big"))
	})
	t.Run("same token cannot push to another repository of the owner", func(t *testing.T) {
		out, err := push(t, dir, writer, e.srv.URL+"/acme/gadgets.git", "feature")
		require.Error(t, err)
		require.Contains(t, out, "403")
		require.Empty(t, e.bareSHA(t, repoGadgets, "refs/heads/feature"))
	})
	t.Run("read-only token clones but cannot push", func(t *testing.T) {
		rdir, out, err := e.clone(t, reader, repoWidgets)
		require.NoError(t, err, out)
		commitBranch(t, rdir, "readonly", map[string]string{"r.txt": "r\n"})
		out, err = push(t, rdir, reader, "origin", "readonly")
		require.Error(t, err)
		require.Contains(t, out, "403")
		require.Empty(t, e.bareSHA(t, repoWidgets, "refs/heads/readonly"))
	})

	basic := func(tok string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+tok))
	}
	raw := []struct {
		name, auth, path string
		want             int
	}{
		{"missing credentials", "", "/acme/widgets.git/info/refs?service=git-upload-pack", 401},
		{"unknown token", basic("ghs_nope"), "/acme/widgets.git/info/refs?service=git-upload-pack", 401},
		{"writer can fetch", basic(writer), "/acme/widgets.git/info/refs?service=git-upload-pack", 200},
		{"writer can start push", basic(writer), "/acme/widgets.git/info/refs?service=git-receive-pack", 200},
		{"any user name with the personal token", "Basic " + base64.StdEncoding.EncodeToString([]byte("me:"+testPersonal)), "/acme/gadgets.git/info/refs?service=git-receive-pack", 200},
		{"writer out of scope", basic(writer), "/acme/gadgets.git/info/refs?service=git-upload-pack", 403},
		{"reader cannot start push", basic(reader), "/acme/widgets.git/info/refs?service=git-receive-pack", 403},
		{"reader cannot post a pack", basic(reader), "/acme/widgets.git/git-receive-pack", 403},
		{"no contents permission cannot clone", basic(noContents), "/acme/widgets.git/info/refs?service=git-upload-pack", 403},
		{"unknown repository", basic(writer), "/acme/nothing.git/info/refs?service=git-upload-pack", 404},
	}
	check := func(t *testing.T, auth, path string, want int) {
		t.Helper()
		method := http.MethodGet
		if strings.HasSuffix(path, "/git-receive-pack") {
			method = http.MethodPost
		}
		req, err := http.NewRequest(method, e.srv.URL+path, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, want, resp.StatusCode, string(body))
		if want == 401 {
			require.Equal(t, `Basic realm="forge"`, resp.Header.Get("WWW-Authenticate"))
		}
		if want == 200 {
			require.Contains(t, resp.Header.Get("Content-Type"), "advertisement")
		}
	}
	for _, tc := range raw {
		t.Run(tc.name, func(t *testing.T) { check(t, tc.auth, tc.path, tc.want) })
	}

	t.Run("git records carry the token id, not the text", func(t *testing.T) {
		var gitReqs int
		for _, r := range e.f.Requests() {
			if r.Kind == "git" {
				gitReqs++
				require.NotContains(t, r.TokenID, "ghs_")
			}
		}
		require.Positive(t, gitReqs)
	})

	t.Run("expired token is refused", func(t *testing.T) {
		e.clock.Advance(time.Hour + time.Second)
		check(t, basic(writer), "/acme/widgets.git/info/refs?service=git-upload-pack", 401)
		_, out, err := e.clone(t, writer, repoWidgets)
		require.Error(t, err, out)
		// the personal token does not expire
		check(t, basic(testPersonal), "/acme/widgets.git/info/refs?service=git-upload-pack", 200)
	})
}

func verifyHook(t *testing.T, h hook, wantAction string) *github.PullRequestEvent {
	t.Helper()
	require.Equal(t, "pull_request", h.header.Get("X-GitHub-Event"))
	require.Equal(t, "application/json", h.header.Get("Content-Type"))
	_, err := uuid.Parse(h.header.Get("X-GitHub-Delivery"))
	require.NoError(t, err)
	require.Equal(t, Signature(testSecret, h.body), h.header.Get("X-Hub-Signature-256"))
	// go-github's own check, as a webhook receiver would do it.
	req := httptest.NewRequest(http.MethodPost, "/hook", bytes.NewReader(h.body))
	req.Header = h.header.Clone()
	payload, err := github.ValidatePayload(req, []byte(testSecret))
	require.NoError(t, err)
	req.Body = io.NopCloser(bytes.NewReader(h.body))
	_, err = github.ValidatePayload(req, []byte("wrong-secret"))
	require.Error(t, err)
	ev, err := github.ParseWebHook(h.header.Get("X-GitHub-Event"), payload)
	require.NoError(t, err)
	pre, ok := ev.(*github.PullRequestEvent)
	require.True(t, ok)
	require.Equal(t, wantAction, pre.GetAction())
	require.Equal(t, "acme/widgets", pre.GetRepo().GetFullName())
	return pre
}

func TestPullRequestMerge(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tok := e.installationToken(t, []string{repoWidgets}, writePerms())
	dir, out, err := e.clone(t, tok, repoWidgets)
	require.NoError(t, err, out)
	headSHA := commitBranch(t, dir, "task-1", map[string]string{"feature.txt": "from the task\n"})
	out, err = push(t, dir, tok, "origin", "task-1")
	require.NoError(t, err, out)
	mainBefore := e.bareSHA(t, repoWidgets, "refs/heads/main")

	gh := e.client(t, tok, true)
	pr, resp, err := gh.PullRequests.Create(ctx, owner1, repoWidgets, &github.NewPullRequest{
		Title: github.String("Task 1"), Head: github.String("acme:task-1"), Base: github.String("main"), Body: github.String("body"), Draft: github.Bool(false),
	})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 1, pr.GetNumber())
	require.Equal(t, "open", pr.GetState())
	require.False(t, pr.GetMerged())
	require.Equal(t, "task-1", pr.GetHead().GetRef())
	require.Equal(t, headSHA, pr.GetHead().GetSHA())
	require.Equal(t, "main", pr.GetBase().GetRef())
	require.Equal(t, e.srv.URL+"/acme/widgets/pull/1", pr.GetHTMLURL())

	opened := verifyHook(t, e.waitHook(t), "opened")
	require.Equal(t, 1, opened.GetNumber())
	require.Equal(t, "task-1", opened.GetPullRequest().GetHead().GetRef())

	for _, tc := range []struct {
		name string
		head string
	}{
		{"open PR for the head already exists", "task-1"},
		{"head branch does not exist", "no-such-branch"},
		{"no commits between base and head", "main"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, resp, err := gh.PullRequests.Create(ctx, owner1, repoWidgets, &github.NewPullRequest{Title: github.String("dup"), Head: github.String(tc.head), Base: github.String("main")})
			require.Error(t, err)
			require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
		})
	}

	for _, tc := range []struct {
		name string
		opts *github.PullRequestListOptions
		want int
	}{
		{"default open", nil, 1},
		{"by head", &github.PullRequestListOptions{Head: "acme:task-1"}, 1},
		{"other head", &github.PullRequestListOptions{Head: "acme:task-2"}, 0},
		{"closed", &github.PullRequestListOptions{State: "closed"}, 0},
		{"all", &github.PullRequestListOptions{State: "all"}, 1},
	} {
		t.Run("list "+tc.name, func(t *testing.T) {
			pulls, _, err := gh.PullRequests.List(ctx, owner1, repoWidgets, tc.opts)
			require.NoError(t, err)
			require.Len(t, pulls, tc.want)
		})
	}

	res, resp, err := gh.PullRequests.Merge(ctx, owner1, repoWidgets, 1, "", &github.PullRequestOptions{SHA: headSHA})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, res.GetMerged())
	mainAfter := e.bareSHA(t, repoWidgets, "refs/heads/main")
	require.Equal(t, res.GetSHA(), mainAfter)
	bare, _ := e.f.RepoDir(owner1, repoWidgets)
	require.Equal(t, mainBefore+" "+headSHA, mustGit(t, "", "--git-dir="+bare, "log", "-1", "--format=%P", "main"), "a --no-ff merge commit")
	require.Equal(t, "from the task", mustGit(t, "", "--git-dir="+bare, "show", "main:feature.txt"))
	_, err = git(t, "", "--git-dir="+bare, "merge-base", "--is-ancestor", headSHA, "main")
	require.NoError(t, err)

	closed := verifyHook(t, e.waitHook(t), "closed")
	require.True(t, closed.GetPullRequest().GetMerged())
	require.Equal(t, 1, closed.GetNumber())
	require.Equal(t, "task-1", closed.GetPullRequest().GetHead().GetRef())
	require.Equal(t, mainAfter, closed.GetPullRequest().GetMergeCommitSHA())

	got, _, err := gh.PullRequests.Get(ctx, owner1, repoWidgets, 1)
	require.NoError(t, err)
	require.Equal(t, "closed", got.GetState())
	require.True(t, got.GetMerged())
	merged, _, err := gh.PullRequests.IsMerged(ctx, owner1, repoWidgets, 1)
	require.NoError(t, err)
	require.True(t, merged)

	_, resp, err = gh.PullRequests.Merge(ctx, owner1, repoWidgets, 1, "", nil)
	require.Error(t, err)
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	prs := e.f.PullRequests("acme/widgets")
	require.Len(t, prs, 1)
	require.True(t, prs[0].Merged)
	require.Equal(t, mainAfter, prs[0].MergeCommitSHA)
	require.Eventually(t, func() bool { return len(e.f.Deliveries()) == 2 }, hookWaitLimit, 10*time.Millisecond)
	for _, d := range e.f.Deliveries() {
		require.Equal(t, http.StatusNoContent, d.StatusCode)
		require.Empty(t, d.Err)
	}
}

func TestPullRequestCloseUnmerged(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir, out, err := e.clone(t, testPersonal, repoWidgets)
	require.NoError(t, err, out)
	commitBranch(t, dir, "task-2", map[string]string{"x.txt": "x\n"})
	out, err = push(t, dir, testPersonal, "origin", "task-2")
	require.NoError(t, err, out)
	mainBefore := e.bareSHA(t, repoWidgets, "refs/heads/main")

	gh := e.client(t, testPersonal, false)
	pr, _, err := gh.PullRequests.Create(ctx, owner1, repoWidgets, &github.NewPullRequest{Title: github.String("Task 2"), Head: github.String("task-2"), Base: github.String("main")})
	require.NoError(t, err)
	verifyHook(t, e.waitHook(t), "opened")

	edited, resp, err := gh.PullRequests.Edit(ctx, owner1, repoWidgets, pr.GetNumber(), &github.PullRequest{State: github.String("closed")})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "closed", edited.GetState())
	require.False(t, edited.GetMerged())

	ev := verifyHook(t, e.waitHook(t), "closed")
	require.False(t, ev.GetPullRequest().GetMerged())
	require.Equal(t, "task-2", ev.GetPullRequest().GetHead().GetRef())
	require.Equal(t, mainBefore, e.bareSHA(t, repoWidgets, "refs/heads/main"))

	rec := e.lastAPIRequest(t)
	require.Equal(t, "PATCH", rec.Method)
	require.Equal(t, "personal", rec.TokenID)
	require.Equal(t, map[string]any{"state": "closed"}, rec.Body)
}

func TestAdminAndSeed(t *testing.T) {
	e := newEnv(t)
	body := `{"owner":"other","name":"lib","files":{"go.mod":"module lib\n","pkg/a.go":"package pkg\n"}}`
	for _, tc := range []struct {
		name string
		body string
		want int
	}{
		{"create", body, 201},
		{"duplicate", body, 422},
		{"bad name", `{"owner":"../x","name":"y"}`, 422},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := e.srv.Client().Post(e.srv.URL+"/_forge/repos", "application/json", strings.NewReader(tc.body))
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, tc.want, resp.StatusCode)
		})
	}
	id, ok := e.f.InstallationID("other")
	require.True(t, ok)
	widgetsInst, _ := e.f.InstallationID(owner1)
	require.NotEqual(t, widgetsInst, id)

	seed := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(seed, "docs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(seed, "docs", "x.md"), []byte("seeded\n"), 0o644))
	require.NoError(t, e.f.SeedFromDir("other", "seeded", seed))
	require.ErrorIs(t, e.f.SeedFromDir("other", "seeded", seed), ErrRepoExists)

	dir := filepath.Join(t.TempDir(), "c")
	out, err := git(t, "", "-c", authHeader(testPersonal), "clone", "--quiet", e.srv.URL+"/other/seeded.git", dir)
	require.NoError(t, err, out)
	data, err := os.ReadFile(filepath.Join(dir, "docs", "x.md"))
	require.NoError(t, err)
	require.Equal(t, "seeded\n", string(data))

	// A second forge on the same data directory finds the repositories again.
	f2, err := New(Config{DataDir: filepath.Dir(filepath.Dir(filepath.Dir(dir0(t, e)))), AppID: testAppID, AppPublicKey: &e.key.PublicKey})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f2.Close()) })
	_, ok = f2.RepoDir("other", "seeded")
	require.True(t, ok)
}

// dir0 returns the bare directory of acme/widgets (DataDir/repos/acme/widgets.git).
func dir0(t *testing.T, e *env) string {
	d, ok := e.f.RepoDir(owner1, repoWidgets)
	require.True(t, ok)
	return d
}
