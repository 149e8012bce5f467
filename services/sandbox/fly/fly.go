package fly

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	fly "github.com/superfly/fly-go"
	"github.com/superfly/fly-go/flaps"
	"github.com/superfly/fly-go/tokens"

	"github.com/taskrunner/taskrunner/services/sandbox"
)

// ProviderName is the configuration name of this provider.
const ProviderName = "fly"

// LabelDeadline records Spec.Deadline (RFC 3339, UTC) in the machine's
// metadata. Fly has no wall-clock limit for a machine; the reaper enforces
// it.
const LabelDeadline = "taskrunner.deadline"

// Defaults applied when Config leaves them zero.
const (
	DefaultCPUKind  = "shared"
	DefaultCPUs     = 1
	DefaultMemoryMB = 1024
)

// Config configures the provider.
type Config struct {
	// App is the Fly app the machines are created in. Required.
	App string `env:"TASKRUNNER_FLY_APP"`
	// Token is a Fly API token (a "FlyV1 fm2_…" macaroon or a bearer
	// token) allowed to manage machines in App. Required.
	Token string `env:"TASKRUNNER_FLY_API_TOKEN"`
	// Image is the runner image used when Spec.Image is empty. Required.
	Image string `env:"TASKRUNNER_FLY_IMAGE"`
	// Region is the region to launch in (e.g. "iad"). Empty: Fly picks.
	Region string `env:"TASKRUNNER_FLY_REGION"`
	// CPUKind is "shared" or "performance". Empty: DefaultCPUKind.
	CPUKind string `env:"TASKRUNNER_FLY_CPU_KIND"`
	// CPUs and MemoryMB size machines whose Spec leaves them zero.
	// Empty: DefaultCPUs, DefaultMemoryMB.
	CPUs     int `env:"TASKRUNNER_FLY_CPUS"`
	MemoryMB int `env:"TASKRUNNER_FLY_MEMORY_MB"`
	// BaseURL is the Machines API endpoint. Empty: FLY_FLAPS_BASE_URL, else
	// https://api.machines.dev (http://_api.internal:4280 inside Fly).
	BaseURL string `env:"TASKRUNNER_FLY_BASE_URL"`
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case strings.TrimSpace(c.App) == "":
		return errors.New("fly provider: App (the Fly app to create machines in) is required")
	case strings.TrimSpace(c.Token) == "":
		return errors.New("fly provider: Token (a Fly API token for the app) is required")
	case strings.TrimSpace(c.Image) == "":
		return errors.New("fly provider: Image (the runner image) is required")
	case c.CPUKind != "" && c.CPUKind != "shared" && c.CPUKind != "performance":
		return fmt.Errorf("fly provider: CPUKind %q must be \"shared\" or \"performance\"", c.CPUKind)
	case c.CPUs < 0 || c.MemoryMB < 0:
		return errors.New("fly provider: CPUs and MemoryMB must not be negative")
	}
	if c.BaseURL != "" {
		u, err := url.Parse(c.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("fly provider: BaseURL %q is not an http(s) URL", c.BaseURL)
		}
	}
	return nil
}

// Provider is the Fly Machines sandbox provider.
type Provider struct {
	cfg       Config
	api       *flaps.Client
	transport *http.Transport
	log       *slog.Logger
}

var _ sandbox.Provider = (*Provider)(nil)

// New validates cfg and builds the flaps client. It does not call Fly.
func New(cfg Config, logger *slog.Logger) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.CPUKind == "" {
		cfg.CPUKind = DefaultCPUKind
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = DefaultCPUs
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = DefaultMemoryMB
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	var rt http.RoundTripper = tr
	if cfg.BaseURL != "" {
		// flaps only reads its endpoint from FLY_FLAPS_BASE_URL; a
		// transport that rewrites scheme and host avoids mutating the
		// process environment.
		u, _ := url.Parse(cfg.BaseURL)
		rt = rewriteHost{base: tr, scheme: u.Scheme, host: u.Host}
	}
	api, err := flaps.NewWithOptions(context.Background(), flaps.NewClientOpts{
		Tokens:    tokens.Parse(cfg.Token),
		UserAgent: "taskrunner",
		Transport: rt,
	})
	if err != nil {
		return nil, fmt.Errorf("fly provider: %w", err)
	}
	return &Provider{cfg: cfg, api: api, transport: tr, log: logger.With("provider", ProviderName)}, nil
}

type rewriteHost struct {
	base         http.RoundTripper
	scheme, host string
}

func (r rewriteHost) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = r.scheme, r.host, ""
	return r.base.RoundTrip(req)
}

// Close releases idle connections.
func (p *Provider) Close() error {
	p.transport.CloseIdleConnections()
	return nil
}

// Name implements sandbox.Provider.
func (p *Provider) Name() string { return ProviderName }

// Create implements sandbox.Provider. Fly has no idempotency key for
// launches, so Create first lists the app's machines with the task-id
// metadata filter and returns a live one if there is one. (Two Creates
// racing for one task can still launch twice; Dispatch serialises
// dispatches per task, and the reaper destroys the loser as an orphan.)
func (p *Provider) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.TaskID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("fly: %w: empty task id", sandbox.ErrInvalidSpec)
	}
	existing, err := p.List(ctx, map[string]string{sandbox.LabelTaskID: spec.TaskID})
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	for _, sb := range existing {
		if sb.State == sandbox.StatePending || sb.State == sandbox.StateRunning {
			p.log.InfoContext(ctx, "machine exists for task", "task_id", spec.TaskID, "machine", sb.ID)
			return sb, nil
		}
	}

	m, err := p.api.Launch(ctx, p.cfg.App, p.launchInput(spec))
	if err != nil {
		return sandbox.Sandbox{}, mapErr("launch machine", err)
	}
	p.log.InfoContext(ctx, "machine launched", "task_id", spec.TaskID, "machine", m.ID, "region", m.Region)
	return fromMachine(m), nil
}

func (p *Provider) launchInput(spec sandbox.Spec) fly.LaunchMachineInput {
	image := spec.Image
	if image == "" {
		image = p.cfg.Image
	}
	cpus := p.cfg.CPUs
	if spec.CPUs > 0 {
		cpus = int(math.Ceil(spec.CPUs)) // Fly guests have whole CPUs
	}
	mem := p.cfg.MemoryMB
	if spec.MemoryMB > 0 {
		mem = spec.MemoryMB
	}
	labels := spec.AllLabels()
	if !spec.Deadline.IsZero() {
		labels[LabelDeadline] = spec.Deadline.UTC().Format(time.RFC3339)
	}
	meta := make(map[string]string, len(labels))
	for k, v := range labels {
		meta[MetadataKey(k)] = v
	}
	cfg := &fly.MachineConfig{
		Image:       image,
		Env:         maps.Clone(spec.Env),
		Guest:       &fly.MachineGuest{CPUKind: p.cfg.CPUKind, CPUs: cpus, MemoryMB: mem},
		AutoDestroy: true,
		Restart:     &fly.MachineRestart{Policy: fly.MachineRestartPolicyNo},
		Metadata:    meta,
	}
	if len(spec.Command) > 0 {
		// Spec.Command replaces the image's entrypoint.
		cfg.Init.Entrypoint = slices.Clone(spec.Command)
	}
	return fly.LaunchMachineInput{Name: sandbox.Name(spec.TaskID), Region: p.cfg.Region, Config: cfg}
}

var machineID = regexp.MustCompile(`^[a-zA-Z0-9]+$`)

// Get implements sandbox.Provider. A destroyed machine that Fly still
// reports comes back with State gone; one it forgot is ErrNotFound.
func (p *Provider) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if !machineID.MatchString(id) {
		return sandbox.Sandbox{}, fmt.Errorf("fly: get machine %q: %w", id, sandbox.ErrNotFound)
	}
	m, err := p.api.Get(ctx, p.cfg.App, id)
	if err != nil {
		return sandbox.Sandbox{}, mapErr("get machine "+id, err)
	}
	return fromMachine(m), nil
}

// List implements sandbox.Provider with Fly's server-side metadata filter
// (metadata.<key>=<value>, ANDed). It always filters on LabelManagedBy,
// re-checks the labels on the answer, and leaves out destroyed machines.
func (p *Provider) List(ctx context.Context, labels map[string]string) ([]sandbox.Sandbox, error) {
	want := map[string]string{sandbox.LabelManagedBy: sandbox.ManagedByValue}
	maps.Copy(want, labels)
	q := url.Values{}
	for k, v := range want {
		q.Set("metadata."+MetadataKey(k), v)
	}
	machines, err := p.api.List(ctx, p.cfg.App, q.Encode())
	if err != nil {
		return nil, mapErr("list machines", err)
	}
	out := make([]sandbox.Sandbox, 0, len(machines))
	for _, m := range machines {
		sb := fromMachine(m)
		if sb.State == sandbox.StateGone || !hasLabels(sb.Labels, want) {
			continue
		}
		out = append(out, sb)
	}
	return out, nil
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// Destroy implements sandbox.Provider: DELETE with kill=true, so a
// running machine is killed rather than refused. A missing machine is
// success.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	if !machineID.MatchString(id) {
		return nil // cannot name a machine, so there is none to destroy
	}
	err := p.api.Destroy(ctx, p.cfg.App, fly.RemoveMachineInput{ID: id, Kill: true}, "")
	if err != nil && !errors.Is(err, flaps.ErrFlapsNotFound) {
		return mapErr("destroy machine "+id, err)
	}
	return nil
}

// MetadataKey is the Fly metadata key a label is stored under.
func MetadataKey(label string) string {
	return metaUnsafe.ReplaceAllString(strings.ToLower(label), "_")
}

var metaUnsafe = regexp.MustCompile(`[^a-z0-9_]`)

// knownLabels maps the metadata keys of the labels taskrunner reads back
// to the label names.
var knownLabels = func() map[string]string {
	m := map[string]string{}
	for _, l := range []string{sandbox.LabelTaskID, sandbox.LabelOwner, sandbox.LabelManagedBy, LabelDeadline} {
		m[MetadataKey(l)] = l
	}
	return m
}()

func fromMachine(m *fly.Machine) sandbox.Sandbox {
	sb := sandbox.Sandbox{ID: m.ID, Provider: ProviderName, State: mapState(m.State), Labels: map[string]string{}}
	if m.Config != nil {
		for k, v := range m.Config.Metadata {
			if l, ok := knownLabels[k]; ok {
				k = l
			}
			sb.Labels[k] = v
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, m.CreatedAt); err == nil {
		sb.CreatedAt = t.UTC()
	}
	if sb.State == sandbox.StateExited || sb.State == sandbox.StateGone {
		if ev := m.GetLatestEventOfType("exit"); ev != nil && ev.Request != nil {
			if code, err := ev.Request.GetExitCode(); err == nil {
				sb.ExitCode = &code
			}
		}
	}
	return sb
}

// mapState folds Fly's machine states
// (https://fly.io/docs/machines/machine-states/) into sandbox states.
func mapState(s string) sandbox.State {
	switch s {
	case "created", "creating", "":
		return sandbox.StatePending
	case "stopped", "failed", "launch_failed":
		return sandbox.StateExited
	case "destroying", "destroyed", "replaced", "migrated":
		return sandbox.StateGone
	default: // starting, started, stopping, restarting, suspending, suspended, updating, replacing
		return sandbox.StateRunning
	}
}

// mapErr wraps a flaps error with the sandbox error it stands for, so
// errors.Is works on both.
func mapErr(op string, err error) error {
	var fe *flaps.FlapsError
	if !errors.As(err, &fe) {
		return fmt.Errorf("fly: %s: %w", op, err)
	}
	var kind error
	status := fe.StatusCode()
	switch {
	case status != nil && *status == "insufficient_capacity",
		strings.Contains(strings.ToLower(fe.Error()), "insufficient"),
		fe.ResponseStatusCode == http.StatusTooManyRequests:
		kind = sandbox.ErrCapacity
	case fe.ResponseStatusCode == http.StatusNotFound:
		kind = sandbox.ErrNotFound
	case fe.ResponseStatusCode == http.StatusUnauthorized, fe.ResponseStatusCode == http.StatusForbidden:
		kind = sandbox.ErrUnauthorized
	case fe.ResponseStatusCode == http.StatusBadRequest, fe.ResponseStatusCode == http.StatusUnprocessableEntity:
		kind = sandbox.ErrInvalidSpec
	}
	// The request id is what Fly support asks for.
	where := fmt.Sprintf("HTTP %d", fe.ResponseStatusCode)
	if fe.FlyRequestId != "" {
		where += ", fly-request-id " + fe.FlyRequestId
	}
	if kind == nil {
		return fmt.Errorf("fly: %s (%s): %w", op, where, err)
	}
	return fmt.Errorf("fly: %s (%s): %w: %w", op, where, kind, err)
}
