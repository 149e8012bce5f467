package sandboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/sandbox"
)

// Harness is one provider under test with hooks into its backend (the
// provider's test server, or the host for the process provider).
type Harness struct {
	// Provider is a fresh provider whose backend holds no sandbox yet.
	Provider sandbox.Provider
	// Spec completes a spec the suite built (image, command…). Optional.
	Spec func(*sandbox.Spec)
	// Instances counts what the backend runs for taskID (containers,
	// Jobs, machines, boxes, processes), read from the backend itself,
	// not through the provider.
	Instances func(t *testing.T, taskID string) int
	// Deadline returns the deadline the backend will enforce (or reports
	// to the reaper) for sandbox id, read from what the provider sent it:
	// activeDeadlineSeconds, a timeout(1) argument, a label or metadata
	// entry. Nil: the provider has no such mechanism, and the test says so.
	Deadline func(t *testing.T, id string) time.Time
	// Residue lists what is left in the backend of the task's sandbox
	// after Destroy (files, Secrets, volumes, containers); it must be
	// empty.
	Residue func(t *testing.T, taskID, id string) []string
	// Foreign puts into the backend a sandbox-like object that taskrunner
	// did not create (no managed-by label), which List must never report.
	Foreign func(t *testing.T)
}

// Run runs every conformance test; newHarness is called once per test.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Run("CreateIsIdempotentPerTask", func(t *testing.T) { testCreateIdempotent(t, newHarness(t)) })
	t.Run("CreateWithoutTaskIDIsInvalid", func(t *testing.T) { testCreateInvalid(t, newHarness(t)) })
	t.Run("Get", func(t *testing.T) { testGet(t, newHarness(t)) })
	t.Run("ListByLabel", func(t *testing.T) { testListByLabel(t, newHarness(t)) })
	t.Run("DestroyIsIdempotentAndLeavesNothing", func(t *testing.T) { testDestroy(t, newHarness(t)) })
	t.Run("DeadlineReachesTheProvider", func(t *testing.T) { testDeadline(t, newHarness(t)) })
	t.Run("OrphansListedByManagedByLabel", func(t *testing.T) { testOrphans(t, newHarness(t)) })
}

// NewSpec returns a spec for a new task owned by owner, with a deadline an
// hour away.
func (h Harness) NewSpec(owner string) sandbox.Spec {
	id := uuid.NewString()
	s := sandbox.Spec{
		TaskID:   id,
		Owner:    owner,
		Env:      map[string]string{"TASKRUNNER_TASK_ID": id},
		CPUs:     1,
		MemoryMB: 512,
		Deadline: time.Now().Add(time.Hour).Truncate(time.Second),
		Labels:   map[string]string{"taskrunner.repo": "acme/widgets"},
	}
	if h.Spec != nil {
		h.Spec(&s)
	}
	return s
}

func (h Harness) create(t *testing.T, spec sandbox.Spec) sandbox.Sandbox {
	t.Helper()
	sb, err := h.Provider.Create(context.Background(), spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Provider.Destroy(context.Background(), sb.ID) })
	require.NotEmpty(t, sb.ID)
	require.Equal(t, h.Provider.Name(), sb.Provider)
	require.Equal(t, spec.TaskID, sb.TaskID())
	return sb
}

func testCreateIdempotent(t *testing.T, h Harness) {
	ctx := context.Background()
	spec := h.NewSpec("alice")
	first := h.create(t, spec)
	second, err := h.Provider.Create(ctx, spec)
	require.NoError(t, err)
	require.Equal(t, first.ID, second.ID, "a second Create for the same task returns the same sandbox")
	require.Equal(t, 1, h.Instances(t, spec.TaskID), "the backend runs exactly one sandbox for the task")

	list, err := h.Provider.List(ctx, map[string]string{sandbox.LabelTaskID: spec.TaskID})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, first.ID, list[0].ID)
}

func testCreateInvalid(t *testing.T, h Harness) {
	spec := h.NewSpec("alice")
	spec.TaskID = ""
	_, err := h.Provider.Create(context.Background(), spec)
	require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
}

func testGet(t *testing.T, h Harness) {
	ctx := context.Background()
	spec := h.NewSpec("alice")
	sb := h.create(t, spec)

	got, err := h.Provider.Get(ctx, sb.ID)
	require.NoError(t, err)
	require.Equal(t, sb.ID, got.ID)
	require.Equal(t, h.Provider.Name(), got.Provider)
	require.Equal(t, spec.TaskID, got.TaskID())
	require.Equal(t, sandbox.ManagedByValue, got.Labels[sandbox.LabelManagedBy])
	require.Contains(t, []sandbox.State{sandbox.StatePending, sandbox.StateRunning}, got.State)
	require.False(t, got.CreatedAt.IsZero())

	_, err = h.Provider.Get(ctx, sandbox.Name(uuid.NewString()))
	require.ErrorIs(t, err, sandbox.ErrNotFound)
}

func testListByLabel(t *testing.T, h Harness) {
	ctx := context.Background()
	a, b := h.NewSpec("alice"), h.NewSpec("bob")
	b.Labels = map[string]string{"taskrunner.repo": "acme/gadgets"}
	sa, sb := h.create(t, a), h.create(t, b)

	ids := func(labels map[string]string) []string {
		t.Helper()
		list, err := h.Provider.List(ctx, labels)
		require.NoError(t, err)
		out := []string{}
		for _, s := range list {
			out = append(out, s.ID)
		}
		return out
	}
	require.ElementsMatch(t, []string{sa.ID, sb.ID}, ids(nil))
	require.ElementsMatch(t, []string{sa.ID}, ids(map[string]string{sandbox.LabelTaskID: a.TaskID}))
	require.ElementsMatch(t, []string{sb.ID}, ids(map[string]string{sandbox.LabelTaskID: b.TaskID}))
	require.Empty(t, ids(map[string]string{sandbox.LabelTaskID: uuid.NewString()}))
	require.Empty(t, ids(map[string]string{sandbox.LabelTaskID: a.TaskID, "taskrunner.repo": "acme/gadgets"}),
		"every label must match, not any")
}

func testDestroy(t *testing.T, h Harness) {
	ctx := context.Background()
	spec := h.NewSpec("alice")
	sb := h.create(t, spec)

	require.NoError(t, h.Provider.Destroy(ctx, sb.ID))
	got, err := h.Provider.Get(ctx, sb.ID)
	if err == nil {
		require.Equal(t, sandbox.StateGone, got.State, "a destroyed sandbox is gone or not found")
	} else {
		require.ErrorIs(t, err, sandbox.ErrNotFound)
	}
	list, err := h.Provider.List(ctx, map[string]string{sandbox.LabelTaskID: spec.TaskID})
	require.NoError(t, err)
	require.Empty(t, list)
	require.Equal(t, 0, h.Instances(t, spec.TaskID))
	require.Empty(t, h.Residue(t, spec.TaskID, sb.ID), "Destroy leaves nothing of the task behind")

	require.NoError(t, h.Provider.Destroy(ctx, sb.ID), "destroying a destroyed sandbox is success")
	require.NoError(t, h.Provider.Destroy(ctx, sandbox.Name(uuid.NewString())), "destroying a sandbox that never existed is success")
}

func testDeadline(t *testing.T, h Harness) {
	if h.Deadline == nil {
		t.Skipf("the %s provider has no deadline mechanism of its own; the reaper enforces Spec.Deadline", h.Provider.Name())
	}
	spec := h.NewSpec("alice")
	spec.Deadline = time.Now().Add(90 * time.Minute).Truncate(time.Second)
	sb := h.create(t, spec)
	require.WithinDuration(t, spec.Deadline, h.Deadline(t, sb.ID), 3*time.Second)
}

func testOrphans(t *testing.T, h Harness) {
	ctx := context.Background()
	if h.Foreign != nil {
		h.Foreign(t)
	}
	a, b := h.NewSpec("alice"), h.NewSpec("bob")
	sa, sb := h.create(t, a), h.create(t, b)
	// The reaper's query after a restart: everything taskrunner manages,
	// without knowing any task id.
	list, err := h.Provider.List(ctx, map[string]string{sandbox.LabelManagedBy: sandbox.ManagedByValue})
	require.NoError(t, err)
	got := map[string]string{}
	for _, s := range list {
		require.Equal(t, sandbox.ManagedByValue, s.Labels[sandbox.LabelManagedBy])
		got[s.ID] = s.TaskID()
	}
	require.Equal(t, map[string]string{sa.ID: a.TaskID, sb.ID: b.TaskID}, got)
}
