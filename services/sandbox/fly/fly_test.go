package fly_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/fly"
	"github.com/taskrunner/taskrunner/services/sandbox/sandboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	app   = "taskrunner-sandboxes"
	token = "test-oauth-token"
)

// machines is a fake Fly Machines API (https://api.machines.dev/v1) for
// the calls the provider makes, with Fly's paths, JSON and status codes.
type machines struct {
	mu       sync.Mutex
	byID     map[string]map[string]any // machine JSON as Fly returns it
	launches []map[string]any          // raw create bodies
	lists    []string                  // raw list query strings
	deletes  []url.Values
	auth     []string
	// failLaunch, when set, answers launches with this status and body.
	failLaunch *failure
	// failAll, when set, answers every request with it.
	failAll *failure
	nextID  int
}

type failure struct {
	Status int
	Body   string
}

func newFake(t *testing.T) (*machines, *httptest.Server) {
	t.Helper()
	f := &machines{byID: map[string]map[string]any{}}
	mux := http.NewServeMux()
	base := "/v1/apps/{app}/machines"
	mux.HandleFunc("POST "+base, f.locked(f.launch))
	mux.HandleFunc("GET "+base, f.locked(f.list))
	mux.HandleFunc("GET "+base+"/{id}", f.locked(f.get))
	mux.HandleFunc("DELETE "+base+"/{id}", f.locked(f.destroy))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return f, srv
}

func newProvider(t *testing.T, f *machines, srv *httptest.Server) *fly.Provider {
	t.Helper()
	p, err := fly.New(fly.Config{App: app, Token: token, Image: "registry.fly.io/runner:1", Region: "iad", BaseURL: srv.URL}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *machines) locked(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.auth = append(f.auth, r.Header.Get("Authorization"))
		w.Header().Set("Fly-Request-Id", "01REQ")
		if r.PathValue("app") != app {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "app not found"})
			return
		}
		if f.failAll != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(f.failAll.Status)
			_, _ = w.Write([]byte(f.failAll.Body))
			return
		}
		h(w, r)
	}
}

func (f *machines) launch(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	f.launches = append(f.launches, body)
	if f.failLaunch != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.failLaunch.Status)
		_, _ = w.Write([]byte(f.failLaunch.Body))
		return
	}
	f.nextID++
	id := fmt.Sprintf("148ed%09x", f.nextID)
	m := map[string]any{
		"id": id, "name": body["name"], "state": "created", "region": body["region"],
		"instance_id": "01J0000000000000000000000", "private_ip": "fdaa::3",
		"created_at": "2026-11-20T10:00:00Z", "updated_at": "2026-11-20T10:00:00Z",
		"config": body["config"], "events": []any{},
	}
	f.byID[id] = m
	writeJSON(w, http.StatusOK, m)
}

func (f *machines) list(w http.ResponseWriter, r *http.Request) {
	f.lists = append(f.lists, r.URL.RawQuery)
	q := r.URL.Query()
	out := []map[string]any{}
	for _, m := range f.byID {
		if m["state"] == "destroyed" && q.Get("include_deleted") != "true" {
			continue
		}
		meta, _ := m["config"].(map[string]any)["metadata"].(map[string]any)
		match := true
		for k, vs := range q {
			if key, ok := strings.CutPrefix(k, "metadata."); ok && meta[key] != vs[0] {
				match = false
			}
		}
		if match {
			out = append(out, m)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (f *machines) get(w http.ResponseWriter, r *http.Request) {
	m, ok := f.byID[r.PathValue("id")]
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "machine not found"})
		return
	}
	writeJSON(w, http.StatusOK, m)
}

func (f *machines) destroy(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f.deletes = append(f.deletes, q)
	m, ok := f.byID[r.PathValue("id")]
	if !ok || m["state"] == "destroyed" {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "machine not found"})
		return
	}
	// The docs name the parameter force, fly-go sends kill.
	if m["state"] == "started" && q.Get("kill") != "true" && q.Get("force") != "true" {
		writeJSON(w, http.StatusPreconditionFailed, map[string]string{"error": "machine still active, refusing to delete"})
		return
	}
	m["state"] = "destroyed"
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

func testSpec() sandbox.Spec {
	return sandbox.Spec{
		TaskID:   "0b7c6f3e-1d2a-4c5b-9e8f-123456789abc",
		Owner:    "alice",
		Command:  []string{"/usr/local/bin/runner"},
		Env:      map[string]string{"TASKRUNNER_TASK_ID": "0b7c6f3e-1d2a-4c5b-9e8f-123456789abc", "TASKRUNNER_EVENTS_ADDR": "cp.internal:9443", "TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		CPUs:     1.5,
		MemoryMB: 2048,
		Deadline: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC),
		Labels:   map[string]string{"taskrunner.repo": "acme/widgets"},
	}
}

// roundTrip turns v into the generic JSON shape the fake decoded.
func roundTrip(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func TestCreateSendsExactLaunchRequest(t *testing.T) {
	f, srv := newFake(t)
	p := newProvider(t, f, srv)
	spec := testSpec()

	sb, err := p.Create(t.Context(), spec)
	require.NoError(t, err)

	require.Len(t, f.launches, 1)
	body := f.launches[0]
	require.Equal(t, "taskrunner-0b7c6f3e-1d2a-4c5b-9e8f-123456789abc", body["name"])
	require.Equal(t, "iad", body["region"])
	cfg := body["config"].(map[string]any)
	require.Equal(t, "registry.fly.io/runner:1", cfg["image"])
	require.Equal(t, roundTrip(t, spec.Env), cfg["env"])
	for k := range cfg["env"].(map[string]any) {
		require.NotContains(t, strings.ToUpper(k), "GITHUB_TOKEN")
		require.NotContains(t, strings.ToUpper(k), "GH_TOKEN")
	}
	require.Equal(t, map[string]any{"cpu_kind": "shared", "cpus": 2.0, "memory_mb": 2048.0}, cfg["guest"])
	require.Equal(t, true, cfg["auto_destroy"])
	require.Equal(t, map[string]any{"policy": "no"}, cfg["restart"])
	require.Equal(t, map[string]any{"entrypoint": []any{"/usr/local/bin/runner"}}, cfg["init"])
	require.Equal(t, map[string]any{
		"taskrunner_task_id":    spec.TaskID,
		"taskrunner_owner":      "alice",
		"taskrunner_managed_by": "taskrunner",
		"taskrunner_repo":       "acme/widgets",
		"taskrunner_deadline":   "2026-11-20T12:00:00Z",
	}, cfg["metadata"])

	// The idempotency look-up ran first, with the server-side filter.
	require.Equal(t, []string{"metadata.taskrunner_managed_by=taskrunner&metadata.taskrunner_task_id=0b7c6f3e-1d2a-4c5b-9e8f-123456789abc"}, f.lists)
	require.Equal(t, "Bearer "+token, f.auth[0])

	require.Equal(t, "148ed000000001", sb.ID)
	require.Equal(t, "fly", sb.Provider)
	require.Equal(t, sandbox.StatePending, sb.State)
	require.Equal(t, spec.TaskID, sb.TaskID())
	require.Equal(t, "alice", sb.Labels[sandbox.LabelOwner])
	require.Equal(t, "2026-11-20T12:00:00Z", sb.Labels[fly.LabelDeadline])
	require.Equal(t, time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC), sb.CreatedAt)
}

func TestCreateIsIdempotentPerTask(t *testing.T) {
	tests := []struct {
		name         string
		firstState   string // state of the first machine when Create runs again
		wantLaunches int
		wantSameID   bool
	}{
		{"live machine is returned", "started", 1, true},
		{"created machine is returned", "created", 1, true},
		{"destroyed machine is replaced", "destroyed", 2, false},
		{"stopped machine is replaced", "stopped", 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, srv := newFake(t)
			p := newProvider(t, f, srv)
			first, err := p.Create(t.Context(), testSpec())
			require.NoError(t, err)
			f.byID[first.ID]["state"] = tt.firstState

			second, err := p.Create(t.Context(), testSpec())
			require.NoError(t, err)
			require.Len(t, f.launches, tt.wantLaunches)
			require.Equal(t, tt.wantSameID, first.ID == second.ID)
		})
	}
}

func TestListUsesServerSideMetadataFilter(t *testing.T) {
	f, srv := newFake(t)
	p := newProvider(t, f, srv)
	a := testSpec()
	b := testSpec()
	b.TaskID, b.Owner = "task-b", "bob"
	sa, err := p.Create(t.Context(), a)
	require.NoError(t, err)
	_, err = p.Create(t.Context(), b)
	require.NoError(t, err)
	f.byID[sa.ID]["state"] = "started"
	f.lists = nil

	tests := []struct {
		name      string
		labels    map[string]string
		wantQuery string
		wantTasks []string
	}{
		{"all of ours", nil, "metadata.taskrunner_managed_by=taskrunner", []string{a.TaskID, "task-b"}},
		{"by owner", map[string]string{sandbox.LabelOwner: "bob"},
			"metadata.taskrunner_managed_by=taskrunner&metadata.taskrunner_owner=bob", []string{"task-b"}},
		{"value needing escapes", map[string]string{"taskrunner.repo": "acme/widgets & co"},
			"metadata.taskrunner_managed_by=taskrunner&metadata.taskrunner_repo=acme%2Fwidgets+%26+co", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := p.List(t.Context(), tt.labels)
			require.NoError(t, err)
			require.Equal(t, tt.wantQuery, f.lists[len(f.lists)-1])
			var tasks []string
			for _, sb := range got {
				tasks = append(tasks, sb.TaskID())
			}
			require.ElementsMatch(t, tt.wantTasks, tasks)
		})
	}
}

func TestGet(t *testing.T) {
	f, srv := newFake(t)
	p := newProvider(t, f, srv)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)

	m := f.byID[sb.ID]
	m["state"] = "stopped"
	m["events"] = []any{
		map[string]any{"type": "exit", "status": "stopped", "source": "flyd", "timestamp": 1763640000000,
			"request": map[string]any{"exit_event": map[string]any{"exit_code": 7, "oom_killed": false, "requested_stop": false}}},
		map[string]any{"type": "start", "status": "started", "source": "flyd", "timestamp": 1763639000000},
	}
	got, err := p.Get(t.Context(), sb.ID)
	require.NoError(t, err)
	require.Equal(t, sandbox.StateExited, got.State)
	require.NotNil(t, got.ExitCode)
	require.Equal(t, 7, *got.ExitCode)
	require.Equal(t, testSpec().TaskID, got.TaskID())

	m["state"] = "destroyed"
	got, err = p.Get(t.Context(), sb.ID)
	require.NoError(t, err)
	require.Equal(t, sandbox.StateGone, got.State)

	_, err = p.Get(t.Context(), "148ed999999999")
	require.ErrorIs(t, err, sandbox.ErrNotFound)
	_, err = p.Get(t.Context(), "../apps")
	require.ErrorIs(t, err, sandbox.ErrNotFound)
}

func TestDestroyKillsARunningMachine(t *testing.T) {
	f, srv := newFake(t)
	p := newProvider(t, f, srv)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	f.byID[sb.ID]["state"] = "started"
	require.NoError(t, p.Destroy(t.Context(), sb.ID))
	require.Equal(t, "true", f.deletes[len(f.deletes)-1].Get("kill"))
	require.Equal(t, "destroyed", f.byID[sb.ID]["state"])
}

func TestConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandboxtest.Harness {
		f, srv := newFake(t)
		lock := func() func() { f.mu.Lock(); return f.mu.Unlock }
		meta := func(m map[string]any) map[string]any {
			md, _ := m["config"].(map[string]any)["metadata"].(map[string]any)
			return md
		}
		live := func(taskID string) []string {
			var ids []string
			for id, m := range f.byID {
				if m["state"] != "destroyed" && meta(m)[fly.MetadataKey(sandbox.LabelTaskID)] == taskID {
					ids = append(ids, id)
				}
			}
			return ids
		}
		return sandboxtest.Harness{
			Provider:  newProvider(t, f, srv),
			Instances: func(t *testing.T, taskID string) int { defer lock()(); return len(live(taskID)) },
			Deadline: func(t *testing.T, id string) time.Time {
				// Fly has no wall-clock limit: the metadata entry is what the
				// reaper enforces.
				defer lock()()
				d, err := time.Parse(time.RFC3339, fmt.Sprint(meta(f.byID[id])[fly.MetadataKey(fly.LabelDeadline)]))
				require.NoError(t, err)
				return d
			},
			Residue: func(t *testing.T, taskID, id string) []string { defer lock()(); return live(taskID) },
			Foreign: func(t *testing.T) {
				defer lock()()
				f.byID["3d8d9e1b"] = map[string]any{"id": "3d8d9e1b", "name": "web", "state": "started",
					"created_at": "2026-11-20T09:00:00Z", "config": map[string]any{"image": "web", "metadata": map[string]any{"fly_process_group": "app"}}}
			},
		}
	})
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name    string
		launch  *failure
		all     *failure
		want    error
		wantMsg string
	}{
		{
			name:    "insufficient capacity",
			launch:  &failure{http.StatusPreconditionFailed, `{"error":"insufficient resources available to fulfill request","status":"insufficient_capacity"}`},
			want:    sandbox.ErrCapacity,
			wantMsg: "insufficient resources",
		},
		{
			name:    "capacity message without status",
			launch:  &failure{http.StatusConflict, `{"error":"could not reserve resource for machine: insufficient memory available to fulfill request"}`},
			want:    sandbox.ErrCapacity,
			wantMsg: "insufficient memory",
		},
		{
			name:    "invalid config",
			launch:  &failure{http.StatusUnprocessableEntity, `{"error":"invalid config.guest.memory_mb"}`},
			want:    sandbox.ErrInvalidSpec,
			wantMsg: "memory_mb",
		},
		{
			name:    "unauthorized",
			all:     &failure{http.StatusUnauthorized, `{"error":"You must be authenticated to view this."}`},
			want:    sandbox.ErrUnauthorized,
			wantMsg: "authenticated",
		},
		{
			name:    "forbidden",
			all:     &failure{http.StatusForbidden, `{"error":"unauthorized"}`},
			want:    sandbox.ErrUnauthorized,
			wantMsg: "HTTP 403",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, srv := newFake(t)
			p := newProvider(t, f, srv)
			f.failLaunch, f.failAll = tt.launch, tt.all
			_, err := p.Create(t.Context(), testSpec())
			require.ErrorIs(t, err, tt.want)
			require.ErrorContains(t, err, tt.wantMsg)
			require.ErrorContains(t, err, "fly-request-id 01REQ")
		})
	}
}

func TestTokenAndBaseURLFromEnvironment(t *testing.T) {
	f, srv := newFake(t)
	// No BaseURL: flaps reads FLY_FLAPS_BASE_URL when the client is built.
	t.Setenv("FLY_FLAPS_BASE_URL", srv.URL)
	p, err := fly.New(fly.Config{App: app, Token: "FlyV1 fm2_lJPECAAAAAAAAMJi", Image: "runner:1"}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	_, err = p.List(t.Context(), nil)
	require.NoError(t, err)
	require.Equal(t, []string{"FlyV1 fm2_lJPECAAAAAAAAMJi"}, f.auth)
}

func TestConfigValidate(t *testing.T) {
	ok := fly.Config{App: "a", Token: "t", Image: "i"}
	tests := []struct {
		name string
		edit func(*fly.Config)
		want string
	}{
		{"ok", func(*fly.Config) {}, ""},
		{"ok performance", func(c *fly.Config) { c.CPUKind = "performance"; c.BaseURL = "http://_api.internal:4280" }, ""},
		{"missing app", func(c *fly.Config) { c.App = "" }, "fly provider: App (the Fly app to create machines in) is required"},
		{"missing token", func(c *fly.Config) { c.Token = " " }, "fly provider: Token (a Fly API token for the app) is required"},
		{"missing image", func(c *fly.Config) { c.Image = "" }, "fly provider: Image (the runner image) is required"},
		{"bad cpu kind", func(c *fly.Config) { c.CPUKind = "dedicated" }, `fly provider: CPUKind "dedicated" must be "shared" or "performance"`},
		{"bad base url", func(c *fly.Config) { c.BaseURL = "api.machines.dev" }, `fly provider: BaseURL "api.machines.dev" is not an http(s) URL`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			err := cfg.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.want)
			_, err = fly.New(cfg, nil)
			require.EqualError(t, err, tt.want)
		})
	}
}
