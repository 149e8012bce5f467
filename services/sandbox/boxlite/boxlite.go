package boxlite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/httpjson"
)

// ProviderName is the configuration name of this provider.
const ProviderName = "boxlite"

// namePrefix is what sandbox.Name puts in front of a task id.
const namePrefix = "taskrunner-"

// Config configures the provider.
type Config struct {
	// URL is where `boxlite serve` listens, e.g. http://127.0.0.1:8100
	// (without /v1). Required.
	URL string `env:"TASKRUNNER_BOXLITE_URL"`
	// APIKey is sent as a bearer token (boxlite serve --api-key).
	// Empty: no Authorization header.
	APIKey string `env:"TASKRUNNER_BOXLITE_API_KEY"`
	// Image is the runner image used when Spec.Image is empty. Required.
	Image string `env:"TASKRUNNER_BOXLITE_IMAGE"`
	// Prefix forces the box path prefix ("default", "local"…) instead of
	// discovering it from GET /v1/me. Empty: discover.
	Prefix string `env:"TASKRUNNER_BOXLITE_PREFIX"`
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	if strings.TrimSpace(c.URL) == "" {
		return errors.New("boxlite provider: URL (where boxlite serve listens, e.g. http://127.0.0.1:8100) is required")
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("boxlite provider: URL %q is not an http(s) URL", c.URL)
	}
	if strings.TrimSpace(c.Image) == "" {
		return errors.New("boxlite provider: Image (the runner image) is required")
	}
	if strings.Contains(c.Prefix, "/") {
		return fmt.Errorf("boxlite provider: Prefix %q must be a single path segment", c.Prefix)
	}
	return nil
}

// Provider is the BoxLite sandbox provider.
type Provider struct {
	cfg       Config
	api       *httpjson.Client
	transport *http.Transport
	log       *slog.Logger

	mu     sync.Mutex
	prefix *string // discovered box-route prefix; "" means no segment
}

var _ sandbox.Provider = (*Provider)(nil)

// New validates cfg. It does not contact BoxLite; the prefix is
// discovered on first use.
func New(cfg Config, logger *slog.Logger) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	p := &Provider{
		cfg: cfg, transport: tr,
		api: &httpjson.Client{
			Base: strings.TrimRight(cfg.URL, "/"),
			// Create pulls the image on first use; give it time.
			HTTP:         &http.Client{Transport: tr, Timeout: 10 * time.Minute},
			BearerToken:  cfg.APIKey,
			ErrorMessage: errorEnvelope,
		},
		log: logger.With("provider", ProviderName),
	}
	if cfg.Prefix != "" {
		p.prefix = &cfg.Prefix
	}
	return p, nil
}

// Close releases idle connections.
func (p *Provider) Close() error {
	p.transport.CloseIdleConnections()
	return nil
}

// Name implements sandbox.Provider.
func (p *Provider) Name() string { return ProviderName }

// box is BoxLite's Box object.
type box struct {
	ID        string            `json:"box_id"`
	Name      *string           `json:"name"`
	Status    string            `json:"status"`
	CreatedAt string            `json:"created_at"`
	Image     string            `json:"image"`
	CPUs      int               `json:"cpus"`
	MemoryMiB int               `json:"memory_mib"`
	Labels    map[string]string `json:"labels"`
}

// createRequest holds only fields every serve generation accepts: the
// server rejects unknown ones.
type createRequest struct {
	Name       string            `json:"name"`
	Image      string            `json:"image"`
	CPUs       int               `json:"cpus,omitempty"`
	MemoryMiB  int               `json:"memory_mib,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
}

// Create implements sandbox.Provider. The box is named
// sandbox.Name(TaskID); an existing box of that name is returned (and
// started if it never was), so Create is idempotent.
func (p *Provider) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.TaskID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("boxlite: %w: empty task id", sandbox.ErrInvalidSpec)
	}
	name := sandbox.Name(spec.TaskID)
	var b box
	err := p.boxes(ctx, http.MethodGet, "/"+name, nil, nil, &b)
	switch {
	case err == nil:
		p.log.InfoContext(ctx, "box exists for task", "task_id", spec.TaskID, "box", b.ID)
	case isStatus(err, http.StatusNotFound):
		err = p.boxes(ctx, http.MethodPost, "", nil, p.createRequest(name, spec), &b)
		if isStatus(err, http.StatusConflict) {
			// Created concurrently under the same name.
			err = p.boxes(ctx, http.MethodGet, "/"+name, nil, nil, &b)
		}
		if err != nil {
			return sandbox.Sandbox{}, mapErr("create box "+name, err)
		}
		p.log.InfoContext(ctx, "box created", "task_id", spec.TaskID, "box", b.ID)
	default:
		return sandbox.Sandbox{}, mapErr("get box "+name, err)
	}

	if b.Status == "configured" {
		if err := p.boxes(ctx, http.MethodPost, "/"+url.PathEscape(b.ID)+"/start", nil, nil, &b); err != nil {
			return sandbox.Sandbox{}, mapErr("start box "+b.ID, err)
		}
	}
	return fromBox(b), nil
}

func (p *Provider) createRequest(name string, spec sandbox.Spec) createRequest {
	req := createRequest{
		Name:       name,
		Image:      spec.Image,
		MemoryMiB:  spec.MemoryMB,
		Env:        maps.Clone(spec.Env),
		Entrypoint: slices.Clone(spec.Command), // replaces the image's entrypoint
	}
	if req.Image == "" {
		req.Image = p.cfg.Image
	}
	if spec.CPUs > 0 {
		req.CPUs = int(math.Ceil(spec.CPUs)) // whole vCPUs
	}
	return req
}

// Get implements sandbox.Provider; BoxLite accepts a box id or name.
func (p *Provider) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	var b box
	if err := p.boxes(ctx, http.MethodGet, "/"+url.PathEscape(id), nil, nil, &b); err != nil {
		return sandbox.Sandbox{}, mapErr("get box "+id, err)
	}
	return fromBox(b), nil
}

// List implements sandbox.Provider. BoxLite cannot filter by label, so
// it pages through all boxes and keeps the taskrunner ones that carry
// labels (see the package comment for which labels a box has).
func (p *Provider) List(ctx context.Context, labels map[string]string) ([]sandbox.Sandbox, error) {
	var out []sandbox.Sandbox
	token := ""
	for range 1000 { // pages; a bound against a server that loops
		q := url.Values{"pageSize": {"100"}}
		if token != "" {
			q.Set("pageToken", token)
		}
		var page struct {
			Boxes         []box   `json:"boxes"`
			NextPageToken *string `json:"next_page_token"`
		}
		if err := p.boxes(ctx, http.MethodGet, "", q, nil, &page); err != nil {
			return nil, mapErr("list boxes", err)
		}
		for _, b := range page.Boxes {
			sb := fromBox(b)
			if sb.Labels[sandbox.LabelManagedBy] == sandbox.ManagedByValue && hasLabels(sb.Labels, labels) {
				out = append(out, sb)
			}
		}
		if page.NextPageToken == nil || *page.NextPageToken == "" {
			return out, nil
		}
		token = *page.NextPageToken
	}
	return nil, errors.New("boxlite: list boxes: too many pages")
}

// Destroy implements sandbox.Provider: a forced remove (stops a running
// box). A missing box is success.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	err := p.boxes(ctx, http.MethodDelete, "/"+url.PathEscape(id), url.Values{"force": {"true"}}, nil, nil)
	if err != nil && !isStatus(err, http.StatusNotFound) {
		return mapErr("remove box "+id, err)
	}
	return nil
}

func fromBox(b box) sandbox.Sandbox {
	sb := sandbox.Sandbox{ID: b.ID, Provider: ProviderName, State: mapState(b.Status), Labels: map[string]string{}}
	maps.Copy(sb.Labels, b.Labels)
	if b.Name != nil {
		if task, ok := strings.CutPrefix(*b.Name, namePrefix); ok && task != "" {
			sb.Labels[sandbox.LabelManagedBy] = sandbox.ManagedByValue
			sb.Labels[sandbox.LabelTaskID] = task
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, b.CreatedAt); err == nil {
		sb.CreatedAt = t.UTC()
	}
	return sb
}

func mapState(s string) sandbox.State {
	switch s {
	case "running", "stopping", "paused":
		return sandbox.StateRunning
	case "stopped", "failed":
		return sandbox.StateExited
	default: // configured, unknown
		return sandbox.StatePending
	}
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// boxPrefix returns the path segment box routes live under ("" for
// none), asking GET /v1/me once: its path_prefix (null: no segment)
// wins, then prefix (older serve), then "default".
func (p *Provider) boxPrefix(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.prefix != nil {
		return *p.prefix, nil
	}
	var me map[string]json.RawMessage
	err := p.do(ctx, http.MethodGet, "/v1/me", nil, nil, &me)
	prefix := "default"
	switch {
	case isStatus(err, http.StatusNotFound):
		// A serve without /v1/me: the middle generation's fixed prefix.
	case err != nil:
		return "", fmt.Errorf("discover box prefix (GET /v1/me): %w", err)
	default:
		if raw, ok := me["path_prefix"]; ok {
			var s *string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", fmt.Errorf("boxlite: GET /v1/me: path_prefix: %w", err)
			}
			prefix = ""
			if s != nil {
				prefix = *s
			}
		} else if raw, ok := me["prefix"]; ok {
			var s string
			if json.Unmarshal(raw, &s) == nil && s != "" {
				prefix = s
			}
		}
	}
	if strings.Contains(prefix, "/") {
		return "", fmt.Errorf("boxlite: GET /v1/me: prefix %q is not a path segment", prefix)
	}
	p.log.InfoContext(ctx, "discovered box route prefix", "prefix", prefix)
	p.prefix = &prefix
	return prefix, nil
}

// boxes calls /v1/{prefix}/boxes{rest}.
func (p *Provider) boxes(ctx context.Context, method, rest string, q url.Values, in, out any) error {
	prefix, err := p.boxPrefix(ctx)
	if err != nil {
		return err
	}
	path := "/v1/boxes" + rest
	if prefix != "" {
		path = "/v1/" + url.PathEscape(prefix) + "/boxes" + rest
	}
	return p.do(ctx, method, path, q, in, out)
}

// errorEnvelope reads BoxLite's {"error":{"message","type","code"}}.
func errorEnvelope(body []byte) (typ, msg string) {
	var env struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &env) != nil {
		return "", ""
	}
	return env.Error.Type, env.Error.Message
}

func isStatus(err error, code int) bool { return httpjson.IsStatus(err, code) }

func (p *Provider) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	return p.api.Do(ctx, method, path, q, in, out)
}

// mapErr wraps an API error with the sandbox error it stands for, so
// errors.Is works on both.
func mapErr(op string, err error) error {
	var ae *httpjson.Error
	if !errors.As(err, &ae) {
		return fmt.Errorf("boxlite: %s: %w", op, err)
	}
	var kind error
	switch ae.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		kind = sandbox.ErrUnauthorized
	case http.StatusNotFound:
		kind = sandbox.ErrNotFound
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		kind = sandbox.ErrInvalidSpec
	case http.StatusTooManyRequests:
		kind = sandbox.ErrCapacity
	default:
		return fmt.Errorf("boxlite: %s: %w", op, err)
	}
	return fmt.Errorf("boxlite: %s: %w: %w", op, kind, err)
}
