package githubtoken

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-github/v62/github"

	"github.com/taskrunner/taskrunner/platform/redact"
)

// Permissions every issued installation token is restricted to (ARCHITECTURE.md section 5).
var tokenPermissions = map[string]string{"contents": "write", "pull_requests": "write", "metadata": "read"}

// githubAPI is the part of GitHub the service calls. Every error it returns is an *apiError
// (or a context error): never a go-github error, whose text could quote a request or response.
type githubAPI struct {
	base   *url.URL
	http   *http.Client
	appID  string
	key    *rsa.PrivateKey
	token  string // personal-token mode
	now    func() time.Time
	secret []string // texts to redact from any message (the personal token)
}

// apiError is a GitHub failure reduced to what is safe to log: the operation, the HTTP status
// (0 when no response came back) and a redacted message.
type apiError struct {
	Op      string
	Status  int
	Message string
}

func (e *apiError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("github: %s: %s", e.Op, e.Message)
	}
	return fmt.Sprintf("github: %s: HTTP %d: %s", e.Op, e.Status, e.Message)
}

// maxMessage bounds a GitHub error message kept in an error or a log.
const maxMessage = 300

// redactMessage masks platform/redact's secret shapes (GitHub tokens, JWTs, bearer values …)
// and the configured secrets, so no message carries one even if a server echoes it.
func redactMessage(s string, secrets ...string) string {
	r, _ := redact.New(nil)
	for _, sec := range secrets {
		r.AddLiteral(sec)
	}
	return r.Clean(s, maxMessage)
}

// sanitize rebuilds err without anything that could carry a secret.
func (g *githubAPI) sanitize(op string, resp *github.Response, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &apiError{Op: op, Message: "timed out or cancelled"}
	}
	out := &apiError{Op: op}
	if resp != nil && resp.Response != nil {
		out.Status = resp.StatusCode
	}
	var er *github.ErrorResponse
	var rl *github.RateLimitError
	var arl *github.AbuseRateLimitError
	switch {
	case errors.As(err, &rl):
		out.Message = "rate limited"
	case errors.As(err, &arl):
		out.Message = "secondary rate limit"
	case errors.As(err, &er):
		out.Message = redactMessage(er.Message, g.secret...)
	default:
		// A transport error: keep only its innermost cause (the URL is ours and holds no
		// credential, but a proxy error could quote headers).
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		out.Message = redactMessage(err.Error(), g.secret...)
	}
	return out
}

// client returns a go-github client that authenticates every request with auth.
func (g *githubAPI) client(auth string) *github.Client {
	hc := *g.http
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", auth)
		return base.RoundTrip(r)
	})
	c := github.NewClient(&hc)
	c.BaseURL = g.base
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// appJWT signs the App JWT: RS256, iss = app or client id, iat backdated 60 s for clock drift,
// exp 9 minutes ahead (GitHub allows at most 10 minutes).
func (g *githubAPI) appJWT() (string, error) {
	now := g.now()
	claims := jwt.RegisteredClaims{
		Issuer:    g.appID,
		IssuedAt:  jwt.NewNumericDate(now.Add(-jwtBackdate)),
		ExpiresAt: jwt.NewNumericDate(now.Add(jwtLifetime)),
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(g.key)
	if err != nil {
		return "", &apiError{Op: "sign app JWT", Message: "signing failed"}
	}
	return s, nil
}

func (g *githubAPI) appClient() (*github.Client, error) {
	tok, err := g.appJWT()
	if err != nil {
		return nil, err
	}
	return g.client("Bearer " + tok), nil
}

// findInstallation returns the installation id of the App on owner/name (404: not installed).
func (g *githubAPI) findInstallation(ctx context.Context, owner, name string) (int64, error) {
	c, err := g.appClient()
	if err != nil {
		return 0, err
	}
	inst, resp, err := c.Apps.FindRepositoryInstallation(ctx, owner, name)
	if err != nil {
		return 0, g.sanitize("find installation of "+owner+"/"+name, resp, err)
	}
	if inst.GetID() == 0 {
		return 0, &apiError{Op: "find installation of " + owner + "/" + name, Status: resp.StatusCode, Message: "response has no installation id"}
	}
	return inst.GetID(), nil
}

// mint creates an installation token for the one repository name of installation id.
func (g *githubAPI) mint(ctx context.Context, installation int64, name string) (string, time.Time, error) {
	c, err := g.appClient()
	if err != nil {
		return "", time.Time{}, err
	}
	opts := &github.InstallationTokenOptions{
		Repositories: []string{name},
		Permissions: &github.InstallationPermissions{
			Contents:     github.String(tokenPermissions["contents"]),
			PullRequests: github.String(tokenPermissions["pull_requests"]),
			Metadata:     github.String(tokenPermissions["metadata"]),
		},
	}
	op := fmt.Sprintf("create installation token (installation %d)", installation)
	tok, resp, err := c.Apps.CreateInstallationToken(ctx, installation, opts)
	if err != nil {
		return "", time.Time{}, g.sanitize(op, resp, err)
	}
	if tok.GetToken() == "" || tok.ExpiresAt == nil {
		return "", time.Time{}, &apiError{Op: op, Status: resp.StatusCode, Message: "response has no token or expiry"}
	}
	return tok.GetToken(), tok.GetExpiresAt().Time, nil
}

// repoReachable reports whether the personal token can read owner/name.
func (g *githubAPI) repoReachable(ctx context.Context, owner, name string) (bool, error) {
	_, resp, err := g.client("token "+g.token).Repositories.Get(ctx, owner, name)
	if resp != nil && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusForbidden) {
		return false, nil
	}
	if err != nil {
		return false, g.sanitize("get repository "+owner+"/"+name, resp, err)
	}
	return true, nil
}

// branchExists reports whether owner/name has branch, read with tok (an installation token
// or the personal token).
func (g *githubAPI) branchExists(ctx context.Context, tok, owner, name, branch string) (bool, error) {
	_, resp, err := g.client("token "+tok).Repositories.GetBranch(ctx, owner, name, branch, 1)
	if resp != nil && resp.StatusCode == http.StatusNotFound {
		return false, nil
	}
	if err != nil {
		return false, g.sanitize("get branch "+branch+" of "+owner+"/"+name, resp, err)
	}
	return true, nil
}

func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}
