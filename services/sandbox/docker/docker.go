package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/taskrunner/taskrunner/services/sandbox"
)

// ProviderName is the configuration name of this provider.
const ProviderName = "docker"

// LabelDeadline records Spec.Deadline (RFC 3339, UTC) on the container.
// Docker has no wall-clock limit for a container, so the reaper enforces
// it; the label lets it do so from the engine's listing alone.
const LabelDeadline = "taskrunner.deadline"

// Endpoint is an Engine API call the provider makes. Path is the route
// with {version} (the negotiated /v1.NN prefix) and {id} (a container id
// or name) as placeholders. A socket proxy in front of the engine must
// allow exactly these (deploy/compose does, and tools/deploytest checks
// it); the provider's tests fail when it makes a call not listed here.
type Endpoint struct{ Method, Path string }

// Endpoints are all the calls the provider makes.
var Endpoints = []Endpoint{
	{http.MethodHead, "/_ping"}, // API version negotiation
	{http.MethodGet, "/_ping"},  // its fallback
	{http.MethodPost, "/{version}/containers/create"},
	{http.MethodPost, "/{version}/containers/{id}/start"},
	{http.MethodGet, "/{version}/containers/{id}/json"},
	{http.MethodGet, "/{version}/containers/json"},
	{http.MethodDelete, "/{version}/containers/{id}"},
	{http.MethodPost, "/{version}/images/create"}, // PullMissing
}

// Sample returns a concrete path for the endpoint.
func (e Endpoint) Sample(version, id string) string {
	return strings.NewReplacer("{version}", version, "{id}", id).Replace(e.Path)
}

// Config configures the provider.
type Config struct {
	// Host is the engine address (unix:///var/run/docker.sock,
	// tcp://host:2376…). Empty: the DOCKER_HOST / DOCKER_TLS_VERIFY /
	// DOCKER_CERT_PATH / DOCKER_API_VERSION environment, else the default
	// local socket.
	Host string `env:"TASKRUNNER_DOCKER_HOST"`
	// Image is the runner image used when Spec.Image is empty. Required.
	Image string `env:"TASKRUNNER_DOCKER_IMAGE"`
	// Runtime is the OCI runtime the engine runs containers with, e.g.
	// "runsc" (gVisor) or "kata-runtime" / "io.containerd.kata.v2" (Kata).
	// It must be registered with the daemon. Empty: the daemon's default.
	Runtime string `env:"TASKRUNNER_DOCKER_RUNTIME"`
	// Network is the network mode or network name ("bridge", "host", a
	// user-defined network). Empty: the daemon's default.
	Network string `env:"TASKRUNNER_DOCKER_NETWORK"`
	// PullMissing pulls the image when the engine reports it missing.
	PullMissing bool `env:"TASKRUNNER_DOCKER_PULL_MISSING"`
	// CPUs and MemoryMB limit a container whose Spec leaves them zero.
	// Zero: DefaultCPUs, DefaultMemoryMB. Every container has limits.
	CPUs     float64 `env:"TASKRUNNER_DOCKER_CPUS"`
	MemoryMB int     `env:"TASKRUNNER_DOCKER_MEMORY_MB"`
	// PidsLimit bounds the processes of a container (fork bombs).
	// Zero: DefaultPidsLimit.
	PidsLimit int64 `env:"TASKRUNNER_DOCKER_PIDS_LIMIT"`
	// Workspace is the writable directory of the otherwise read-only
	// container: a fresh anonymous volume per container, removed with it.
	// Empty: DefaultWorkspace (the runner image's TASKRUNNER_WORKDIR).
	Workspace string `env:"TASKRUNNER_DOCKER_WORKSPACE"`
	// TmpSizeMB is the size of the tmpfs on /tmp. Zero: DefaultTmpSizeMB.
	TmpSizeMB int `env:"TASKRUNNER_DOCKER_TMP_SIZE_MB"`
}

// Defaults of the hardening settings.
const (
	DefaultCPUs      = 2
	DefaultMemoryMB  = 4096
	DefaultPidsLimit = 1024
	DefaultWorkspace = "/workspace"
	DefaultTmpSizeMB = 1024
)

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	if strings.TrimSpace(c.Image) == "" {
		return errors.New("docker provider: Image (the runner image) is required")
	}
	if c.Host != "" {
		u, err := client.ParseHostURL(c.Host)
		if err == nil && u.Scheme != "unix" && u.Scheme != "tcp" && u.Scheme != "npipe" {
			err = errors.New("the scheme must be unix://, tcp:// or npipe://")
		}
		if err != nil {
			return fmt.Errorf("docker provider: Host %q is not a valid engine address: %w", c.Host, err)
		}
	}
	if strings.ContainsAny(c.Runtime, " \t/") {
		return fmt.Errorf("docker provider: Runtime %q is not a runtime name", c.Runtime)
	}
	if c.CPUs < 0 || c.MemoryMB < 0 || c.PidsLimit < 0 || c.TmpSizeMB < 0 {
		return errors.New("docker provider: CPUs, MemoryMB, PidsLimit and TmpSizeMB must not be negative")
	}
	if c.Workspace != "" && (!strings.HasPrefix(c.Workspace, "/") || c.Workspace == "/") {
		return fmt.Errorf("docker provider: Workspace %q must be an absolute directory other than /", c.Workspace)
	}
	return nil
}

// Provider is the Docker sandbox provider.
type Provider struct {
	cfg Config
	cli *client.Client
	log *slog.Logger
}

var _ sandbox.Provider = (*Provider)(nil)

// New validates cfg and builds the engine client. It does not contact
// the engine: the API version is negotiated on the first request.
func New(cfg Config, logger *slog.Logger) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	opts := []client.Opt{client.FromEnv}
	if cfg.Host != "" {
		opts = append(opts, client.WithHost(cfg.Host))
	}
	cli, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker provider: engine client: %w", err)
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = DefaultCPUs
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = DefaultMemoryMB
	}
	if cfg.PidsLimit == 0 {
		cfg.PidsLimit = DefaultPidsLimit
	}
	if cfg.Workspace == "" {
		cfg.Workspace = DefaultWorkspace
	}
	if cfg.TmpSizeMB == 0 {
		cfg.TmpSizeMB = DefaultTmpSizeMB
	}
	return &Provider{cfg: cfg, cli: cli, log: logger.With("provider", ProviderName)}, nil
}

// Close releases idle connections to the engine.
func (p *Provider) Close() error { return p.cli.Close() }

// Name implements sandbox.Provider.
func (p *Provider) Name() string { return ProviderName }

// Create implements sandbox.Provider. The container is named
// sandbox.Name(TaskID); when a container of that name exists already the
// engine answers 409 and Create returns (and if need be starts) that one.
func (p *Provider) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.TaskID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("docker: %w: empty task id", sandbox.ErrInvalidSpec)
	}
	name := sandbox.Name(spec.TaskID)
	opts := p.createOptions(name, spec)

	res, err := p.cli.ContainerCreate(ctx, opts)
	if err != nil && cerrdefs.IsNotFound(err) && p.cfg.PullMissing {
		if perr := p.pull(ctx, opts.Config.Image); perr != nil {
			return sandbox.Sandbox{}, perr
		}
		res, err = p.cli.ContainerCreate(ctx, opts)
	}
	id := res.ID
	switch {
	case err == nil:
		p.log.InfoContext(ctx, "container created", "task_id", spec.TaskID, "container", id)
	case cerrdefs.IsConflict(err):
		// Same name: an earlier Create for this task got there first.
		id = name
	case cerrdefs.IsNotFound(err):
		return sandbox.Sandbox{}, fmt.Errorf("docker: create container %s: %w: image %q is not on the engine (set PullMissing to pull it): %w",
			name, sandbox.ErrInvalidSpec, opts.Config.Image, err)
	default:
		return sandbox.Sandbox{}, mapErr("create container "+name, err)
	}

	c, err := p.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return sandbox.Sandbox{}, mapErr("inspect container "+id, err)
	}
	if got := fromInspect(c.Container).TaskID(); got != spec.TaskID {
		// sandbox.Name folds case and punctuation, so two task ids can
		// share a name; never hand one task another task's container.
		return sandbox.Sandbox{}, fmt.Errorf("docker: %w: container %s belongs to task %q, not %q", sandbox.ErrInvalidSpec, name, got, spec.TaskID)
	}
	if c.Container.State != nil && c.Container.State.Status == container.StateCreated {
		if _, err := p.cli.ContainerStart(ctx, c.Container.ID, client.ContainerStartOptions{}); err != nil {
			return sandbox.Sandbox{}, mapErr("start container "+id, err)
		}
		c.Container.State.Status = container.StateRunning
		c.Container.State.Running = true
	}
	return fromInspect(c.Container), nil
}

func (p *Provider) createOptions(name string, spec sandbox.Spec) client.ContainerCreateOptions {
	image := spec.Image
	if image == "" {
		image = p.cfg.Image
	}
	labels := spec.AllLabels()
	if !spec.Deadline.IsZero() {
		labels[LabelDeadline] = spec.Deadline.UTC().Format(time.RFC3339)
	}
	env := make([]string, 0, len(spec.Env))
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, k+"="+spec.Env[k])
	}
	cfg := &container.Config{
		Image:  image,
		Env:    env,
		Labels: labels,
	}
	if len(spec.Command) > 0 {
		// Spec.Command replaces the image's entrypoint; with Entrypoint set
		// and Cmd empty the engine drops the image's CMD as well.
		cfg.Entrypoint = slices.Clone(spec.Command)
	}
	cpus, mem := spec.CPUs, spec.MemoryMB
	if cpus <= 0 {
		cpus = p.cfg.CPUs
	}
	if mem <= 0 {
		mem = p.cfg.MemoryMB
	}
	pids := p.cfg.PidsLimit
	host := &container.HostConfig{
		Runtime:       p.cfg.Runtime,
		AutoRemove:    false, // keep the exit code for Get; Destroy removes
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Resources: container.Resources{
			NanoCPUs:   int64(math.Round(cpus * 1e9)),
			Memory:     int64(mem) << 20,
			MemorySwap: int64(mem) << 20, // no swap beyond the limit
			PidsLimit:  &pids,
		},
		// The runner needs no privilege: it runs as the image's user and
		// only writes its workspace and /tmp.
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges:true"},
		ReadonlyRootfs: true,
		Init:           ptr(true), // reaps the agent's orphans
		Mounts: []mount.Mount{{
			// Anonymous: created for this container, deleted by Destroy
			// (RemoveVolumes), filled from the image's directory (owner
			// included) on first use.
			Type: mount.TypeVolume, Target: p.cfg.Workspace,
		}},
		Tmpfs: map[string]string{"/tmp": fmt.Sprintf("rw,nosuid,nodev,size=%dm", p.cfg.TmpSizeMB)},
	}
	if p.cfg.Network != "" {
		host.NetworkMode = container.NetworkMode(p.cfg.Network)
	}
	return client.ContainerCreateOptions{Name: name, Config: cfg, HostConfig: host}
}

func (p *Provider) pull(ctx context.Context, image string) error {
	p.log.InfoContext(ctx, "pulling image", "image", image)
	resp, err := p.cli.ImagePull(ctx, image, client.ImagePullOptions{})
	if err != nil {
		return mapErr("pull "+image, err)
	}
	defer resp.Close()
	if err := resp.Wait(ctx); err != nil {
		return mapErr("pull "+image, err)
	}
	return nil
}

// Get implements sandbox.Provider.
func (p *Provider) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	c, err := p.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return sandbox.Sandbox{}, mapErr("inspect container "+id, err)
	}
	return fromInspect(c.Container), nil
}

// List implements sandbox.Provider. It only ever reports containers that
// carry LabelManagedBy, whatever labels asks for.
func (p *Provider) List(ctx context.Context, labels map[string]string) ([]sandbox.Sandbox, error) {
	f := make(client.Filters).Add("label", sandbox.LabelManagedBy+"="+sandbox.ManagedByValue)
	for k, v := range labels {
		f.Add("label", k+"="+v)
	}
	res, err := p.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, mapErr("list containers", err)
	}
	out := make([]sandbox.Sandbox, 0, len(res.Items))
	for _, c := range res.Items {
		out = append(out, sandbox.Sandbox{
			ID:        c.ID,
			Provider:  ProviderName,
			State:     mapState(c.State),
			Labels:    c.Labels,
			CreatedAt: time.Unix(c.Created, 0).UTC(),
		})
	}
	return out, nil
}

// Destroy implements sandbox.Provider: a forced remove (SIGKILL, then
// delete with its anonymous volumes). A missing container is success.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	_, err := p.cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	// 404: already gone; 409: a removal is already in progress.
	if err != nil && !cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) {
		return mapErr("remove container "+id, err)
	}
	return nil
}

func fromInspect(c container.InspectResponse) sandbox.Sandbox {
	sb := sandbox.Sandbox{ID: c.ID, Provider: ProviderName, State: sandbox.StatePending}
	if c.Config != nil {
		sb.Labels = c.Config.Labels
	}
	if t, err := time.Parse(time.RFC3339Nano, c.Created); err == nil {
		sb.CreatedAt = t.UTC()
	}
	if c.State != nil {
		sb.State = mapState(c.State.Status)
		if sb.State == sandbox.StateExited {
			code := c.State.ExitCode
			sb.ExitCode = &code
		}
	}
	return sb
}

func mapState(s container.ContainerState) sandbox.State {
	switch s {
	case container.StateRunning, container.StatePaused, container.StateRestarting:
		return sandbox.StateRunning
	case container.StateExited, container.StateDead:
		return sandbox.StateExited
	case container.StateRemoving:
		return sandbox.StateGone
	default: // created
		return sandbox.StatePending
	}
}

// mapErr wraps an engine error with the sandbox error it stands for, so
// errors.Is works on both.
func mapErr(op string, err error) error {
	var kind error
	switch {
	case cerrdefs.IsNotFound(err):
		kind = sandbox.ErrNotFound
	case cerrdefs.IsUnauthorized(err), cerrdefs.IsPermissionDenied(err):
		kind = sandbox.ErrUnauthorized
	case cerrdefs.IsResourceExhausted(err):
		kind = sandbox.ErrCapacity
	case cerrdefs.IsInvalidArgument(err):
		kind = sandbox.ErrInvalidSpec
	default:
		return fmt.Errorf("docker: %s: %w", op, err)
	}
	return fmt.Errorf("docker: %s: %w: %w", op, kind, err)
}

func ptr[T any](v T) *T { return &v }
