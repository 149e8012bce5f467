package sandbox

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"time"
)

// Labels every sandbox carries.
const (
	LabelTaskID = "taskrunner.task-id"
	LabelOwner  = "taskrunner.owner"
	// LabelManagedBy marks sandboxes created by taskrunner, so List can find
	// orphans without knowing task ids.
	LabelManagedBy = "taskrunner.managed-by"
	ManagedByValue = "taskrunner"
)

// State is a provider-neutral sandbox state.
type State string

// States.
const (
	StatePending State = "pending" // created, not running yet
	StateRunning State = "running"
	StateExited  State = "exited" // finished; resources may still exist
	StateGone    State = "gone"   // destroyed
)

// Spec describes a sandbox to create.
type Spec struct {
	// TaskID makes Create idempotent: the provider derives the sandbox's
	// name (or idempotency key) from it.
	TaskID string
	Owner  string
	// Image is the runner image (ignored by the process provider).
	Image string
	// Command overrides the image's entrypoint when set.
	Command []string
	// Env is the runner's whole environment. It never holds a GitHub token.
	Env map[string]string
	// CPUs and MemoryMB are limits (0: provider default).
	CPUs     float64
	MemoryMB int
	// Deadline is when the provider must stop the sandbox at the latest.
	Deadline time.Time
	// Labels are added to LabelTaskID, LabelOwner and LabelManagedBy.
	Labels map[string]string
}

// AllLabels returns the spec's labels including the standard ones.
func (s Spec) AllLabels() map[string]string {
	out := map[string]string{LabelTaskID: s.TaskID, LabelOwner: s.Owner, LabelManagedBy: ManagedByValue}
	for k, v := range s.Labels {
		out[k] = v
	}
	return out
}

// Sandbox is what a provider reports.
type Sandbox struct {
	ID        string
	Provider  string
	State     State
	Labels    map[string]string
	CreatedAt time.Time
	// ExitCode is set once the sandbox exited, when the provider knows it.
	ExitCode *int
}

// TaskID returns the task the sandbox runs.
func (s Sandbox) TaskID() string { return s.Labels[LabelTaskID] }

// Provider creates, inspects and destroys sandboxes.
type Provider interface {
	// Name is the provider's configuration name ("process", "docker"…).
	Name() string
	// Create starts a sandbox for spec. Calling it again for the same
	// TaskID returns the existing sandbox instead of starting a second one.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Get returns a sandbox by id, or ErrNotFound.
	Get(ctx context.Context, id string) (Sandbox, error)
	// List returns the sandboxes carrying all of labels.
	List(ctx context.Context, labels map[string]string) ([]Sandbox, error)
	// Destroy removes a sandbox. A missing sandbox is success.
	Destroy(ctx context.Context, id string) error
}

// Errors providers map their own errors to (wrap with fmt.Errorf("%w")).
var (
	ErrNotFound     = errors.New("sandbox not found")
	ErrCapacity     = errors.New("provider has no capacity")
	ErrUnauthorized = errors.New("provider refused our credentials")
	ErrInvalidSpec  = errors.New("invalid sandbox spec")
)

var nameUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// Name derives a provider-safe, deterministic sandbox name from a task id
// (lowercase letters, digits and dashes, at most 63 characters).
func Name(taskID string) string {
	n := "taskrunner-" + nameUnsafe.ReplaceAllString(strings.ToLower(taskID), "-")
	if len(n) > 63 {
		n = n[:63]
	}
	return strings.TrimRight(n, "-")
}
