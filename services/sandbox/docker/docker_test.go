package docker_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/docker"
	"github.com/taskrunner/taskrunner/services/sandbox/sandboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// apiVersion is what the fake engine announces on /_ping; the client
// negotiates down to it and prefixes every path with /v1.47.
const apiVersion = "1.47"

// engine is a fake Docker Engine speaking the subset of the Engine API
// the provider uses, with the engine's status codes and JSON fields.
type engine struct {
	t  *testing.T
	mu sync.Mutex
	// containers by name (without the leading slash).
	containers map[string]*container.InspectResponse
	images     map[string]bool
	creates    []createCall
	starts     []string
	removes    []url.Values
	listQuery  []url.Values
	pulls      []url.Values
	// failCreate, when set, answers every create with this status + message.
	failCreate *apiError
	nextID     int
	// volumes are the anonymous volumes the engine made for containers'
	// volume mounts without a source, by container id.
	volumes map[string][]string
}

type createCall struct {
	Name string
	Body container.CreateRequest
}

type apiError struct {
	Status  int
	Message string
}

func newEngine(t *testing.T, opts ...func(*docker.Config)) (*engine, *docker.Provider) {
	t.Helper()
	e := &engine{t: t, containers: map[string]*container.InspectResponse{}, images: map[string]bool{"runner:1": true}, volumes: map[string][]string{}}
	var (
		mu    sync.Mutex
		calls []string
	)
	h := e.handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	// Every call is one docker.Endpoints lists, so a socket proxy that
	// allows those lets the provider work.
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range calls {
			require.True(t, listedEndpoint(c), "%s is not in docker.Endpoints", c)
		}
	})
	cfg := docker.Config{
		Host:        "tcp://" + strings.TrimPrefix(srv.URL, "http://"),
		Image:       "runner:1",
		Runtime:     "runsc",
		PullMissing: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := docker.New(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return e, p
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"message": msg})
}

func (e *engine) handler() http.Handler {
	mux := http.NewServeMux()
	ping := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Api-Version", apiVersion)
		w.Header().Set("Ostype", "linux")
		w.WriteHeader(http.StatusOK)
	}
	mux.HandleFunc("HEAD /_ping", ping)
	mux.HandleFunc("GET /_ping", ping)
	versioned := func(pattern string, h http.HandlerFunc) {
		method, path, _ := strings.Cut(pattern, " ")
		mux.HandleFunc(method+" /{version}"+path, func(w http.ResponseWriter, r *http.Request) {
			if r.PathValue("version") != "v"+apiVersion {
				writeErr(w, http.StatusBadRequest, "unexpected API version "+r.PathValue("version"))
				return
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			h(w, r)
		})
	}
	versioned("POST /containers/create", e.create)
	versioned("POST /containers/{id}/start", e.start)
	versioned("GET /containers/{id}/json", e.inspect)
	versioned("GET /containers/json", e.list)
	versioned("DELETE /containers/{id}", e.remove)
	versioned("POST /images/create", e.pull)
	return mux
}

// find looks a container up by id or name, as the engine does.
func (e *engine) find(ref string) (string, *container.InspectResponse) {
	if c, ok := e.containers[ref]; ok {
		return ref, c
	}
	for name, c := range e.containers {
		if c.ID == ref {
			return name, c
		}
	}
	return "", nil
}

func (e *engine) create(w http.ResponseWriter, r *http.Request) {
	var body container.CreateRequest
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	name := r.URL.Query().Get("name")
	e.creates = append(e.creates, createCall{Name: name, Body: body})
	if e.failCreate != nil {
		writeErr(w, e.failCreate.Status, e.failCreate.Message)
		return
	}
	if _, ok := e.containers[name]; ok {
		writeErr(w, http.StatusConflict, fmt.Sprintf(`Conflict. The container name "/%s" is already in use by container "x". You have to remove (or rename) that container to be able to reuse that name.`, name))
		return
	}
	if !e.images[body.Image] {
		writeErr(w, http.StatusNotFound, "No such image: "+body.Image)
		return
	}
	e.nextID++
	id := fmt.Sprintf("%064d", e.nextID)
	for i, m := range body.HostConfig.Mounts {
		if m.Type == mount.TypeVolume && m.Source == "" {
			e.volumes[id] = append(e.volumes[id], fmt.Sprintf("%s-%d", id[:12], i))
		}
	}
	e.containers[name] = &container.InspectResponse{
		ID:         id,
		Name:       "/" + name,
		Created:    "2026-11-20T10:00:00.123456789Z",
		State:      &container.State{Status: container.StateCreated},
		Config:     body.Config,
		HostConfig: body.HostConfig,
	}
	writeJSON(w, http.StatusCreated, container.CreateResponse{ID: id, Warnings: []string{}})
}

func (e *engine) start(w http.ResponseWriter, r *http.Request) {
	_, c := e.find(r.PathValue("id"))
	if c == nil {
		writeErr(w, http.StatusNotFound, "No such container: "+r.PathValue("id"))
		return
	}
	e.starts = append(e.starts, c.ID)
	c.State = &container.State{Status: container.StateRunning, Running: true, Pid: 42}
	w.WriteHeader(http.StatusNoContent)
}

func (e *engine) inspect(w http.ResponseWriter, r *http.Request) {
	_, c := e.find(r.PathValue("id"))
	if c == nil {
		writeErr(w, http.StatusNotFound, "No such container: "+r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (e *engine) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	e.listQuery = append(e.listQuery, q)
	var filters map[string]map[string]bool
	if f := q.Get("filters"); f != "" {
		if err := json.Unmarshal([]byte(f), &filters); err != nil {
			writeErr(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	out := []container.Summary{}
	for name, c := range e.containers {
		match := true
		for kv := range filters["label"] {
			k, v, _ := strings.Cut(kv, "=")
			if c.Config.Labels[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, container.Summary{
				ID: c.ID, Names: []string{"/" + name}, Image: c.Config.Image,
				Labels: c.Config.Labels, State: c.State.Status, Created: 1763632800,
			})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *engine) remove(w http.ResponseWriter, r *http.Request) {
	e.removes = append(e.removes, r.URL.Query())
	name, c := e.find(r.PathValue("id"))
	if c == nil {
		writeErr(w, http.StatusNotFound, "No such container: "+r.PathValue("id"))
		return
	}
	if c.State.Running && r.URL.Query().Get("force") != "1" {
		writeErr(w, http.StatusConflict, "You cannot remove a running container")
		return
	}
	delete(e.containers, name)
	if r.URL.Query().Get("v") == "1" {
		delete(e.volumes, c.ID) // anonymous volumes go with the container
	}
	w.WriteHeader(http.StatusNoContent)
}

func (e *engine) pull(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	e.pulls = append(e.pulls, q)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]string{"status": "Pulling from " + q.Get("fromImage"), "id": q.Get("tag")})
	_ = enc.Encode(map[string]string{"status": "Status: Downloaded newer image"})
	e.images[strings.TrimPrefix(q.Get("fromImage"), "docker.io/library/")+":"+q.Get("tag")] = true
}

func testSpec() sandbox.Spec {
	return sandbox.Spec{
		TaskID:   "0b7c6f3e-1d2a-4c5b-9e8f-123456789abc",
		Owner:    "alice",
		Command:  []string{"/usr/local/bin/runner", "--task"},
		Env:      map[string]string{"TASKRUNNER_TASK_ID": "0b7c6f3e-1d2a-4c5b-9e8f-123456789abc", "TASKRUNNER_EVENTS_ADDR": "cp:9443", "TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		CPUs:     1.5,
		MemoryMB: 2048,
		Deadline: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC),
		Labels:   map[string]string{"taskrunner.repo": "acme/widgets"},
	}
}

func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, "env entry %q", kv)
		out[k] = v
	}
	return out
}

func TestCreateSendsExactRequestAndStarts(t *testing.T) {
	e, p := newEngine(t)
	spec := testSpec()

	sb, err := p.Create(t.Context(), spec)
	require.NoError(t, err)

	require.Len(t, e.creates, 1)
	call := e.creates[0]
	require.Equal(t, "taskrunner-0b7c6f3e-1d2a-4c5b-9e8f-123456789abc", call.Name)
	body := call.Body
	require.Equal(t, "runner:1", body.Image)
	require.Equal(t, spec.Env, envMap(t, body.Env))
	for _, kv := range body.Env {
		require.NotContains(t, strings.ToUpper(kv), "GITHUB_TOKEN")
		require.NotContains(t, strings.ToUpper(kv), "GH_TOKEN")
	}
	require.Equal(t, []string(spec.Command), []string(body.Entrypoint))
	require.Empty(t, body.Cmd)
	require.Equal(t, map[string]string{
		sandbox.LabelTaskID:    spec.TaskID,
		sandbox.LabelOwner:     "alice",
		sandbox.LabelManagedBy: sandbox.ManagedByValue,
		"taskrunner.repo":      "acme/widgets",
		docker.LabelDeadline:   "2026-11-20T12:00:00Z",
	}, body.Labels)
	require.NotNil(t, body.HostConfig)
	require.Equal(t, "runsc", body.HostConfig.Runtime)
	require.False(t, body.HostConfig.AutoRemove)
	require.Equal(t, container.RestartPolicyDisabled, body.HostConfig.RestartPolicy.Name)
	require.Equal(t, int64(1_500_000_000), body.HostConfig.NanoCPUs)
	require.Equal(t, int64(2048*1024*1024), body.HostConfig.Memory)
	requireHardened(t, body.HostConfig, 2048)

	require.Len(t, e.starts, 1)
	require.Equal(t, fmt.Sprintf("%064d", 1), sb.ID)
	require.Equal(t, e.starts[0], sb.ID)
	require.Equal(t, "docker", sb.Provider)
	require.Equal(t, sandbox.StateRunning, sb.State)
	require.Equal(t, spec.TaskID, sb.TaskID())
	require.Equal(t, time.Date(2026, 11, 20, 10, 0, 0, 123456789, time.UTC), sb.CreatedAt)
}

// requireHardened checks what every runner container gets: no
// capabilities, no privilege gain, a read-only root with a writable
// workspace volume and /tmp, and memory, swap, CPU and process limits.
func requireHardened(t *testing.T, hc *container.HostConfig, memMB int64) {
	t.Helper()
	require.Equal(t, []string{"ALL"}, []string(hc.CapDrop))
	require.Empty(t, hc.CapAdd)
	require.Equal(t, []string{"no-new-privileges:true"}, hc.SecurityOpt)
	require.True(t, hc.ReadonlyRootfs)
	require.False(t, hc.Privileged)
	require.Equal(t, []mount.Mount{{Type: mount.TypeVolume, Target: "/workspace"}}, hc.Mounts)
	require.Empty(t, hc.Binds, "no host path reaches the container")
	require.Equal(t, map[string]string{"/tmp": "rw,nosuid,nodev,size=1024m"}, hc.Tmpfs)
	require.Equal(t, memMB<<20, hc.Memory)
	require.Equal(t, memMB<<20, hc.MemorySwap)
	require.Positive(t, hc.NanoCPUs)
	require.NotNil(t, hc.PidsLimit)
	require.Equal(t, int64(docker.DefaultPidsLimit), *hc.PidsLimit)
	require.NotNil(t, hc.Init)
	require.True(t, *hc.Init)
}

func TestCreateHardensEveryContainer(t *testing.T) {
	tests := []struct {
		name    string
		cfg     func(*docker.Config)
		spec    func(*sandbox.Spec)
		runtime string
		memMB   int64
		cpus    int64
	}{
		{"gVisor, spec limits", func(c *docker.Config) { c.Runtime = "runsc" }, func(*sandbox.Spec) {}, "runsc", 2048, 1_500_000_000},
		{"Kata", func(c *docker.Config) { c.Runtime = "io.containerd.kata.v2" }, func(*sandbox.Spec) {}, "io.containerd.kata.v2", 2048, 1_500_000_000},
		{"default runtime, no spec limits", func(c *docker.Config) { c.Runtime = "" },
			func(s *sandbox.Spec) { s.CPUs, s.MemoryMB = 0, 0 }, "", docker.DefaultMemoryMB, docker.DefaultCPUs * 1e9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, p := newEngine(t, tt.cfg)
			spec := testSpec()
			tt.spec(&spec)
			_, err := p.Create(t.Context(), spec)
			require.NoError(t, err)
			hc := e.creates[0].Body.HostConfig
			require.Equal(t, tt.runtime, hc.Runtime)
			require.Equal(t, tt.cpus, hc.NanoCPUs)
			requireHardened(t, hc, tt.memMB)
		})
	}
}

func TestConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandboxtest.Harness {
		e, p := newEngine(t)
		lock := func() func() { e.mu.Lock(); return e.mu.Unlock }
		return sandboxtest.Harness{
			Provider: p,
			Instances: func(t *testing.T, taskID string) int {
				defer lock()()
				n := 0
				for _, c := range e.containers {
					if c.Config.Labels[sandbox.LabelTaskID] == taskID {
						n++
					}
				}
				return n
			},
			Deadline: func(t *testing.T, id string) time.Time {
				// Docker has no wall-clock limit: the label is what the
				// reaper enforces.
				defer lock()()
				_, c := e.find(id)
				require.NotNil(t, c)
				d, err := time.Parse(time.RFC3339, c.Config.Labels[docker.LabelDeadline])
				require.NoError(t, err)
				return d
			},
			Residue: func(t *testing.T, taskID, id string) []string {
				defer lock()()
				var left []string
				if _, c := e.find(id); c != nil {
					left = append(left, "container "+id)
				}
				left = append(left, e.volumes[id]...)
				return left
			},
			Foreign: func(t *testing.T) {
				defer lock()()
				e.containers["postgres"] = &container.InspectResponse{ID: "pg", Name: "/postgres", Created: "2026-11-20T09:00:00Z",
					State:  &container.State{Status: container.StateRunning},
					Config: &container.Config{Image: "postgres", Labels: map[string]string{sandbox.LabelOwner: "alice"}}}
			},
		}
	})
}

func TestCreateStartsAContainerLeftCreated(t *testing.T) {
	e, p := newEngine(t)
	spec := testSpec()
	// An earlier Create died between create and start.
	e.containers[sandbox.Name(spec.TaskID)] = &container.InspectResponse{
		ID: "abc", Name: "/" + sandbox.Name(spec.TaskID), Created: "2026-11-20T10:00:00Z",
		State:  &container.State{Status: container.StateCreated},
		Config: &container.Config{Image: "runner:1", Labels: spec.AllLabels()},
	}
	sb, err := p.Create(t.Context(), spec)
	require.NoError(t, err)
	require.Equal(t, "abc", sb.ID)
	require.Equal(t, []string{"abc"}, e.starts)
	require.Equal(t, sandbox.StateRunning, sb.State)
}

func TestCreatePullsAMissingImage(t *testing.T) {
	e, p := newEngine(t)
	spec := testSpec()
	spec.Image = "ghcr.io/acme/runner:2"

	sb, err := p.Create(t.Context(), spec)
	require.NoError(t, err)
	require.Len(t, e.pulls, 1)
	require.Equal(t, "ghcr.io/acme/runner", e.pulls[0].Get("fromImage"))
	require.Equal(t, "2", e.pulls[0].Get("tag"))
	require.Len(t, e.creates, 2, "create, pull, create again")
	require.Equal(t, "ghcr.io/acme/runner:2", e.creates[1].Body.Image)
	require.Equal(t, sandbox.StateRunning, sb.State)
}

func TestCreateMapsEngineErrors(t *testing.T) {
	tests := []struct {
		name   string
		status int
		msg    string
		want   error
	}{
		{"unknown runtime", http.StatusBadRequest, "unknown or invalid runtime name: runsc", sandbox.ErrInvalidSpec},
		{"unauthorized", http.StatusUnauthorized, "authorization denied", sandbox.ErrUnauthorized},
		{"forbidden", http.StatusForbidden, "authorization denied by plugin", sandbox.ErrUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, p := newEngine(t)
			e.failCreate = &apiError{Status: tt.status, Message: tt.msg}
			_, err := p.Create(t.Context(), testSpec())
			require.ErrorIs(t, err, tt.want)
			require.Contains(t, err.Error(), tt.msg)
			require.Empty(t, e.starts)
		})
	}
	t.Run("missing image without pulls", func(t *testing.T) {
		e, p := newEngine(t, func(c *docker.Config) { c.PullMissing = false })
		e.images = map[string]bool{}
		_, err := p.Create(t.Context(), testSpec())
		require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
		require.Contains(t, err.Error(), "No such image")
		require.Empty(t, e.pulls)
	})
	t.Run("empty task id", func(t *testing.T) {
		e, p := newEngine(t)
		spec := testSpec()
		spec.TaskID = ""
		_, err := p.Create(t.Context(), spec)
		require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
		require.Empty(t, e.creates)
	})
}

func TestGet(t *testing.T) {
	e, p := newEngine(t)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)

	got, err := p.Get(t.Context(), sb.ID)
	require.NoError(t, err)
	require.Equal(t, sandbox.StateRunning, got.State)
	require.Nil(t, got.ExitCode)

	e.containers[sandbox.Name(testSpec().TaskID)].State = &container.State{Status: container.StateExited, ExitCode: 3}
	got, err = p.Get(t.Context(), sb.ID)
	require.NoError(t, err)
	require.Equal(t, sandbox.StateExited, got.State)
	require.NotNil(t, got.ExitCode)
	require.Equal(t, 3, *got.ExitCode)

	_, err = p.Get(t.Context(), "nope")
	require.ErrorIs(t, err, sandbox.ErrNotFound)
}

func TestListFiltersByLabel(t *testing.T) {
	e, p := newEngine(t)
	a := testSpec()
	b := testSpec()
	b.TaskID, b.Owner = "task-b", "bob"
	_, err := p.Create(t.Context(), a)
	require.NoError(t, err)
	_, err = p.Create(t.Context(), b)
	require.NoError(t, err)
	// A container that is not ours must never be reported.
	e.containers["postgres"] = &container.InspectResponse{ID: "pg", State: &container.State{Status: container.StateRunning},
		Config: &container.Config{Labels: map[string]string{sandbox.LabelOwner: "bob"}}}

	tests := []struct {
		name        string
		labels      map[string]string
		wantFilters map[string]map[string]bool
		wantTasks   []string
	}{
		{
			name:        "all of ours",
			labels:      nil,
			wantFilters: map[string]map[string]bool{"label": {"taskrunner.managed-by=taskrunner": true}},
			wantTasks:   []string{a.TaskID, "task-b"},
		},
		{
			name:   "by owner",
			labels: map[string]string{sandbox.LabelOwner: "bob"},
			wantFilters: map[string]map[string]bool{"label": {
				"taskrunner.managed-by=taskrunner": true, "taskrunner.owner=bob": true,
			}},
			wantTasks: []string{"task-b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := p.List(t.Context(), tt.labels)
			require.NoError(t, err)
			q := e.listQuery[len(e.listQuery)-1]
			require.Equal(t, "1", q.Get("all"))
			var filters map[string]map[string]bool
			require.NoError(t, json.Unmarshal([]byte(q.Get("filters")), &filters))
			require.Equal(t, tt.wantFilters, filters)
			var tasks []string
			for _, sb := range got {
				require.Equal(t, sandbox.StateRunning, sb.State)
				require.Equal(t, "docker", sb.Provider)
				tasks = append(tasks, sb.TaskID())
			}
			require.ElementsMatch(t, tt.wantTasks, tasks)
		})
	}
}

func TestDestroyForcesAndRemovesVolumes(t *testing.T) {
	e, p := newEngine(t)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	require.Len(t, e.volumes[sb.ID], 1, "the workspace volume")
	require.NoError(t, p.Destroy(t.Context(), sb.ID))
	q := e.removes[len(e.removes)-1]
	require.Equal(t, "1", q.Get("force"), "a running container is killed, not refused")
	require.Equal(t, "1", q.Get("v"), "its workspace volume goes with it")
	require.Empty(t, e.volumes)
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  docker.Config
		want string
	}{
		{"ok", docker.Config{Image: "runner:1", Runtime: "kata-runtime"}, ""},
		{"ok with host", docker.Config{Image: "runner:1", Host: "unix:///var/run/docker.sock"}, ""},
		{"missing image", docker.Config{}, "docker provider: Image (the runner image) is required"},
		{"bad host", docker.Config{Image: "runner:1", Host: "ftp://x"}, `docker provider: Host "ftp://x" is not a valid engine address`},
		{"bad runtime", docker.Config{Image: "runner:1", Runtime: "/usr/bin/runsc"}, `docker provider: Runtime "/usr/bin/runsc" is not a runtime name`},
		{"negative limit", docker.Config{Image: "runner:1", PidsLimit: -1}, "docker provider: CPUs, MemoryMB, PidsLimit and TmpSizeMB must not be negative"},
		{"relative workspace", docker.Config{Image: "runner:1", Workspace: "workspace"}, `docker provider: Workspace "workspace" must be an absolute directory other than /`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
			_, err = docker.New(tt.cfg, nil)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestCreateRefusesAnotherTasksContainer(t *testing.T) {
	e, p := newEngine(t)
	a := testSpec()
	a.TaskID = "Task_A"
	_, err := p.Create(t.Context(), a)
	require.NoError(t, err)

	b := testSpec()
	b.TaskID = "task-a" // same sandbox.Name
	_, err = p.Create(t.Context(), b)
	require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
	require.ErrorContains(t, err, `belongs to task "Task_A"`)
	require.Len(t, e.starts, 1)
}

func listedEndpoint(call string) bool {
	method, path, _ := strings.Cut(call, " ")
	for _, ep := range docker.Endpoints {
		pat := "^" + regexp.QuoteMeta(ep.Path) + "$"
		pat = strings.NewReplacer(regexp.QuoteMeta("{version}"), `v1\.[0-9]+`, regexp.QuoteMeta("{id}"), `[^/]+`).Replace(pat)
		if ep.Method == method && regexp.MustCompile(pat).MatchString(path) {
			return true
		}
	}
	return false
}

func TestListedEndpointIsStrict(t *testing.T) {
	require.True(t, listedEndpoint("DELETE /v1.47/containers/abc"))
	require.True(t, listedEndpoint("HEAD /_ping"))
	require.False(t, listedEndpoint("POST /v1.47/containers/abc/exec"))
	require.False(t, listedEndpoint("GET /v1.47/containers/abc/archive"))
	require.False(t, listedEndpoint("DELETE /v1.47/images/runner:1"))
}
