package forge

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Config configures a Forge. Only DataDir, AppID and AppPublicKey are required.
type Config struct {
	// DataDir holds the bare repositories, under DataDir/repos/{owner}/{name}.git.
	DataDir string
	// AppID is the GitHub App id; an app JWT's `iss` may be this id (as a string or a number).
	AppID int64
	// ClientID is also accepted as the JWT issuer. Default "Iv1.forge".
	ClientID string
	// AppPublicKey verifies app JWTs (RS256).
	AppPublicKey *rsa.PublicKey
	// PersonalToken, when not empty, is accepted on every endpoint with full access.
	PersonalToken string
	// TokenTTL is the lifetime of installation access tokens. Default 1h, like GitHub.
	TokenTTL time.Duration
	// WebhookURL receives pull_request webhooks; empty disables delivery.
	WebhookURL string
	// WebhookSecret signs webhook bodies (X-Hub-Signature-256).
	WebhookSecret string
	// PublicURL is the forge's external base URL used in html_url/clone_url fields.
	// Empty means: derive it from each request's Host.
	PublicURL string
	// Now is the clock; default time.Now. Tests inject one to expire tokens.
	Now func() time.Time
	// Logger receives operational logs; default discards. Token text is never logged.
	Logger *slog.Logger
	// Git is the git binary; default "git".
	Git string
	// WebhookClient delivers webhooks; default a client with a 10s timeout.
	WebhookClient *http.Client
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("forge: DataDir is required"))
	}
	if c.AppID <= 0 {
		errs = append(errs, errors.New("forge: AppID must be positive"))
	}
	if c.AppPublicKey == nil {
		errs = append(errs, errors.New("forge: AppPublicKey is required"))
	}
	if c.TokenTTL < 0 {
		errs = append(errs, errors.New("forge: TokenTTL must not be negative"))
	}
	if c.WebhookURL != "" && c.WebhookSecret == "" {
		errs = append(errs, errors.New("forge: WebhookSecret is required with WebhookURL"))
	}
	return errors.Join(errs...)
}

// Request is one request the forge received, as recorded for tests.
type Request struct {
	// Kind is "api" (REST), "git" (smart HTTP) or "admin" (/_forge/...).
	Kind   string
	Method string
	// Path is relative to the API root: a request to /api/v3/repos/o/r is recorded as /repos/o/r.
	Path  string
	Query string
	// Body is the parsed JSON body (nil when empty or not JSON).
	Body any
	// JWTClaims holds the verified claims when the request was app (JWT) authenticated.
	JWTClaims map[string]any
	// TokenID identifies the installation token ("ghs-N") or "personal"; never the token text.
	TokenID string
	// IssuedTokenID is the id of the installation token an access_tokens request created.
	IssuedTokenID string
	// Status is the HTTP status the forge answered with.
	Status int
}

// Delivery is one webhook delivery attempt.
type Delivery struct {
	ID         string
	Event      string
	Action     string
	StatusCode int
	Err        string
}

// Forge is the local GitHub stand-in. Serve it with Handler; call Close when done.
type Forge struct {
	cfg         Config
	log         *slog.Logger
	now         func() time.Time
	git         string
	httpBackend string
	repoRoot    string
	hookClient  *http.Client
	handler     http.Handler

	writeMu sync.Mutex // serialises repository creation and merges
	wg      sync.WaitGroup

	mu            sync.Mutex
	nextID        int64
	nextToken     int64
	owners        map[string]*owner // by lower-case login
	installations map[int64]*owner
	repos         map[string]*repo // by lower-case "owner/name"
	tokens        map[string]*token
	requests      []*Request
	deliveries    []Delivery
	queue         []pendingDelivery
	delivering    bool
	closed        bool
}

// New builds a Forge and registers the bare repositories already present in DataDir.
func New(cfg Config) (*Forge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "Iv1.forge"
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Git == "" {
		cfg.Git = "git"
	}
	hookClient := cfg.WebhookClient
	if hookClient == nil {
		hookClient = &http.Client{Timeout: 10 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	execPath, err := exec.Command(cfg.Git, "--exec-path").Output()
	if err != nil {
		return nil, fmt.Errorf("forge: git --exec-path: %w", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		return nil, fmt.Errorf("forge: git-http-backend: %w", err)
	}
	root, err := filepath.Abs(filepath.Join(cfg.DataDir, "repos"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("forge: %w", err)
	}
	f := &Forge{
		cfg:           cfg,
		log:           cfg.Logger,
		now:           cfg.Now,
		git:           cfg.Git,
		httpBackend:   backend,
		repoRoot:      root,
		hookClient:    hookClient,
		nextID:        1000,
		owners:        map[string]*owner{},
		installations: map[int64]*owner{},
		repos:         map[string]*repo{},
		tokens:        map[string]*token{},
	}
	f.handler = f.routes()
	if err := f.loadExisting(context.Background()); err != nil {
		return nil, err
	}
	return f, nil
}

// Handler serves the REST API (at / and /api/v3/), git smart HTTP at /{owner}/{repo}.git/ and
// the admin endpoint POST /_forge/repos.
func (f *Forge) Handler() http.Handler { return f.handler }

// Close waits for in-flight webhook deliveries and releases idle connections.
func (f *Forge) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.wg.Wait()
	f.hookClient.CloseIdleConnections()
	return nil
}

// Requests returns a copy of every request received so far, oldest first.
func (f *Forge) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Request, 0, len(f.requests))
	for _, r := range f.requests {
		c := *r
		if r.JWTClaims != nil {
			c.JWTClaims = make(map[string]any, len(r.JWTClaims))
			for k, v := range r.JWTClaims {
				c.JWTClaims[k] = v
			}
		}
		out = append(out, c)
	}
	return out
}

// Deliveries returns the webhook deliveries completed so far, oldest first.
func (f *Forge) Deliveries() []Delivery {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Delivery(nil), f.deliveries...)
}

// PullRequests returns a copy of the pull requests of "owner/name", by number.
func (f *Forge) PullRequests(fullName string) []PullRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	rp := f.repos[strings.ToLower(fullName)]
	if rp == nil {
		return nil
	}
	out := make([]PullRequest, 0, len(rp.pulls))
	for _, p := range rp.pulls {
		out = append(out, *p)
	}
	return out
}

// InstallationID returns the installation id of an owner (every owner with a repository has one).
func (f *Forge) InstallationID(ownerLogin string) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.owners[strings.ToLower(ownerLogin)]
	if o == nil {
		return 0, false
	}
	return o.installationID, true
}

// RepoDir returns the path of the bare repository "owner/name".
func (f *Forge) RepoDir(ownerLogin, name string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rp := f.repos[strings.ToLower(ownerLogin+"/"+name)]
	if rp == nil {
		return "", false
	}
	return rp.dir, true
}

func (f *Forge) newID() int64 {
	f.nextID++
	return f.nextID
}
