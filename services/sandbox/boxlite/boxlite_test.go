package boxlite_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/boxlite"
	"github.com/taskrunner/taskrunner/services/sandbox/sandboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	apiKey = "serve-key"
	taskID = "0b7c6f3e-1d2a-4c5b-9e8f-123456789abc"
	name   = "taskrunner-0b7c6f3e-1d2a-4c5b-9e8f-123456789abc"
)

// serve is a fake `boxlite serve`: box routes under a configurable
// prefix, GET /v1/me answering like one of the server generations,
// strict request bodies (the server rejects unknown fields), BoxLite's
// error envelope and status codes.
type serve struct {
	mu sync.Mutex
	// me is the body of GET /v1/me; nil: the route does not exist.
	me     map[string]any
	prefix string // "" : /v1/boxes
	boxes  []map[string]any
	// creates holds the raw create bodies; calls "METHOD path?query".
	creates  []map[string]any
	calls    []string
	pageSize int
	// failCreate answers creates with this status and error type.
	failCreate *apiErr
	// hideOnce makes the next GET of a box 404 (a concurrent create).
	hideOnce bool
	// throttle answers the next n requests with 429 and Retry-After: 1.
	throttle int
	nextID   int
}

type apiErr struct {
	Status  int
	Type    string
	Message string
}

var createFields = []string{"name", "image", "rootfs_path", "cpus", "memory_mib", "disk_size_gb", "working_dir", "env", "entrypoint", "cmd", "user", "network", "auto_remove", "detach"}

func newServe(t *testing.T, me map[string]any, prefix string) (*serve, *httptest.Server) {
	t.Helper()
	s := &serve{me: me, prefix: prefix, pageSize: 100}
	srv := httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	t.Cleanup(srv.Close)
	return s, srv
}

func newProvider(t *testing.T, srv *httptest.Server) *boxlite.Provider {
	t.Helper()
	p, err := boxlite.New(boxlite.Config{URL: srv.URL + "/", APIKey: apiKey, Image: "ghcr.io/acme/runner:1"}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, e apiErr) {
	writeJSON(w, e.Status, map[string]any{"error": map[string]any{"message": e.Message, "type": e.Type, "code": e.Status}})
}

func (s *serve) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	call := r.Method + " " + r.URL.Path
	if r.URL.RawQuery != "" {
		call += "?" + r.URL.RawQuery
	}
	s.calls = append(s.calls, call)
	if r.Header.Get("Authorization") != "Bearer "+apiKey {
		writeErr(w, apiErr{http.StatusUnauthorized, "UnauthorizedError", "invalid or missing API key"})
		return
	}
	if s.throttle > 0 && r.Method == http.MethodPost {
		s.throttle--
		w.Header().Set("Retry-After", "1")
		writeErr(w, apiErr{http.StatusTooManyRequests, "RateLimitError", "too many requests"})
		return
	}
	if r.URL.Path == "/v1/me" && r.Method == http.MethodGet && s.me != nil {
		writeJSON(w, http.StatusOK, s.me)
		return
	}
	base := "/v1/boxes"
	if s.prefix != "" {
		base = "/v1/" + s.prefix + "/boxes"
	}
	rest, ok := strings.CutPrefix(r.URL.Path, base)
	if !ok {
		http.NotFound(w, r) // axum answers unknown routes with a bare 404
		return
	}
	parts := strings.Split(strings.Trim(rest, "/"), "/")
	switch {
	case rest == "" && r.Method == http.MethodPost:
		s.create(w, r)
	case rest == "" && r.Method == http.MethodGet:
		s.list(w, r)
	case len(parts) == 1 && r.Method == http.MethodGet:
		b := s.find(parts[0])
		if b == nil || s.hideOnce {
			s.hideOnce = false
			writeErr(w, apiErr{http.StatusNotFound, "NotFoundError", "box not found: " + parts[0]})
			return
		}
		writeJSON(w, http.StatusOK, b)
	case len(parts) == 2 && parts[1] == "start" && r.Method == http.MethodPost:
		b := s.find(parts[0])
		if b == nil {
			writeErr(w, apiErr{http.StatusNotFound, "NotFoundError", "box not found: " + parts[0]})
			return
		}
		b["status"] = "running"
		writeJSON(w, http.StatusOK, b)
	case len(parts) == 1 && r.Method == http.MethodDelete:
		b := s.find(parts[0])
		if b == nil {
			writeErr(w, apiErr{http.StatusNotFound, "NotFoundError", "box not found: " + parts[0]})
			return
		}
		if b["status"] == "running" && r.URL.Query().Get("force") != "true" {
			writeErr(w, apiErr{http.StatusConflict, "InvalidStateError", "invalid state: box is running"})
			return
		}
		s.boxes = slices.DeleteFunc(s.boxes, func(x map[string]any) bool { return x["box_id"] == b["box_id"] })
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

func (s *serve) find(ref string) map[string]any {
	for _, b := range s.boxes {
		if b["box_id"] == ref || b["name"] == ref {
			return b
		}
	}
	return nil
}

func (s *serve) create(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeErr(w, apiErr{http.StatusBadRequest, "InvalidArgumentError", err.Error()})
		return
	}
	s.creates = append(s.creates, body)
	for k := range body {
		if !slices.Contains(createFields, k) {
			writeErr(w, apiErr{http.StatusUnprocessableEntity, "InvalidArgumentError", "unknown field `" + k + "`"})
			return
		}
	}
	if s.failCreate != nil {
		writeErr(w, *s.failCreate)
		return
	}
	if n, _ := body["name"].(string); n != "" && s.find(n) != nil {
		writeErr(w, apiErr{http.StatusConflict, "AlreadyExistsError", "box already exists: " + n})
		return
	}
	s.nextID++
	b := map[string]any{
		"box_id": fmt.Sprintf("01JBOX%020d", s.nextID), "name": body["name"], "status": "configured",
		"created_at": "2026-11-20T10:00:00Z", "updated_at": "2026-11-20T10:00:00Z", "pid": nil,
		"image": body["image"], "cpus": body["cpus"], "memory_mib": body["memory_mib"], "labels": map[string]string{},
	}
	s.boxes = append(s.boxes, b)
	writeJSON(w, http.StatusCreated, b)
}

func (s *serve) list(w http.ResponseWriter, r *http.Request) {
	start, _ := strconv.Atoi(r.URL.Query().Get("pageToken"))
	end := min(start+s.pageSize, len(s.boxes))
	resp := map[string]any{"boxes": s.boxes[start:end], "next_page_token": nil}
	if end < len(s.boxes) {
		resp["next_page_token"] = strconv.Itoa(end)
	}
	writeJSON(w, http.StatusOK, resp)
}

func testSpec() sandbox.Spec {
	return sandbox.Spec{
		TaskID:   taskID,
		Owner:    "alice",
		Command:  []string{"/usr/local/bin/runner"},
		Env:      map[string]string{"TASKRUNNER_TASK_ID": taskID, "TASKRUNNER_EVENTS_ADDR": "10.0.2.2:9443", "TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		CPUs:     1.5,
		MemoryMB: 2048,
	}
}

func TestPrefixDiscovery(t *testing.T) {
	tests := []struct {
		name      string
		me        map[string]any
		prefix    string
		wantBoxes string
	}{
		{"current serve: path_prefix null", map[string]any{"sub": "local", "path_prefix": nil, "prefix": "default"}, "", "/v1/boxes"},
		{"cloud: path_prefix set", map[string]any{"sub": "u1", "path_prefix": "acme-corp"}, "acme-corp", "/v1/acme-corp/boxes"},
		{"middle serve: prefix", map[string]any{"sub": "local-anonymous", "principal_type": "service_account", "prefix": "default"}, "default", "/v1/default/boxes"},
		{"no /v1/me", nil, "default", "/v1/default/boxes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, srv := newServe(t, tt.me, tt.prefix)
			p := newProvider(t, srv)

			sb, err := p.Create(t.Context(), testSpec())
			require.NoError(t, err)
			got, err := p.Get(t.Context(), sb.ID)
			require.NoError(t, err)
			require.Equal(t, sb.ID, got.ID)
			list, err := p.List(t.Context(), nil)
			require.NoError(t, err)
			require.Len(t, list, 1)
			require.NoError(t, p.Destroy(t.Context(), sb.ID))

			require.Equal(t, []string{
				"GET /v1/me", // once: the prefix is cached
				"GET " + tt.wantBoxes + "/" + name,
				"POST " + tt.wantBoxes,
				"POST " + tt.wantBoxes + "/" + sb.ID + "/start",
				"GET " + tt.wantBoxes + "/" + sb.ID,
				"GET " + tt.wantBoxes + "?pageSize=100",
				"DELETE " + tt.wantBoxes + "/" + sb.ID + "?force=true",
			}, s.calls)
		})
	}
	t.Run("configured prefix skips discovery", func(t *testing.T) {
		s, srv := newServe(t, nil, "local")
		p, err := boxlite.New(boxlite.Config{URL: srv.URL, APIKey: apiKey, Image: "runner:1", Prefix: "local"}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		_, err = p.List(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, []string{"GET /v1/local/boxes?pageSize=100"}, s.calls)
	})
}

func TestCreateSendsExactRequest(t *testing.T) {
	s, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
	p := newProvider(t, srv)
	spec := testSpec()

	sb, err := p.Create(t.Context(), spec)
	require.NoError(t, err)

	require.Len(t, s.creates, 1)
	body := s.creates[0]
	env := map[string]any{}
	for k, v := range spec.Env {
		require.NotContains(t, strings.ToUpper(k), "GITHUB_TOKEN")
		require.NotContains(t, strings.ToUpper(k), "GH_TOKEN")
		env[k] = v
	}
	require.Equal(t, map[string]any{
		"name":       name,
		"image":      "ghcr.io/acme/runner:1",
		"cpus":       2.0,
		"memory_mib": 2048.0,
		"env":        env,
		"entrypoint": []any{"/usr/local/bin/runner"},
	}, body)

	require.Equal(t, "01JBOX00000000000000000001", sb.ID)
	require.Equal(t, "boxlite", sb.Provider)
	require.Equal(t, sandbox.StateRunning, sb.State, "created boxes are started")
	require.Equal(t, map[string]string{sandbox.LabelTaskID: taskID, sandbox.LabelManagedBy: "taskrunner"}, sb.Labels)
	require.Equal(t, "2026-11-20T10:00:00Z", sb.CreatedAt.Format("2006-01-02T15:04:05Z07:00"))
}

func TestCreateLosingARaceReturnsTheWinner(t *testing.T) {
	t.Run("concurrent create wins", func(t *testing.T) {
		s, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
		p := newProvider(t, srv)
		first, err := p.Create(t.Context(), testSpec())
		require.NoError(t, err)
		s.hideOnce = true // our look-up misses it, our create gets 409
		second, err := p.Create(t.Context(), testSpec())
		require.NoError(t, err)
		require.Equal(t, first.ID, second.ID)
		require.Len(t, s.boxes, 1)
	})
}

func TestListPagesAndFilters(t *testing.T) {
	s, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
	p := newProvider(t, srv)
	b := testSpec()
	b.TaskID = "task-b"
	_, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	_, err = p.Create(t.Context(), b)
	require.NoError(t, err)
	s.boxes = append(s.boxes, map[string]any{"box_id": "01JOTHER", "name": "dev-box", "status": "running",
		"created_at": "2026-11-20T09:00:00Z", "updated_at": "2026-11-20T09:00:00Z", "image": "alpine", "cpus": 1, "memory_mib": 512})
	s.pageSize = 1

	tests := []struct {
		name      string
		labels    map[string]string
		wantTasks []string
	}{
		{"all of ours", nil, []string{taskID, "task-b"}},
		{"by task", map[string]string{sandbox.LabelTaskID: "task-b"}, []string{"task-b"}},
		{"by a label boxlite cannot store", map[string]string{sandbox.LabelOwner: "alice"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.calls = nil
			got, err := p.List(t.Context(), tt.labels)
			require.NoError(t, err)
			require.Equal(t, []string{
				"GET /v1/boxes?pageSize=100",
				"GET /v1/boxes?pageSize=100&pageToken=1",
				"GET /v1/boxes?pageSize=100&pageToken=2",
			}, s.calls)
			var tasks []string
			for _, sb := range got {
				tasks = append(tasks, sb.TaskID())
			}
			require.ElementsMatch(t, tt.wantTasks, tasks)
		})
	}
}

func TestDestroyForcesARunningBox(t *testing.T) {
	s, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
	p := newProvider(t, srv)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	require.Equal(t, "running", s.boxes[0]["status"])
	require.NoError(t, p.Destroy(t.Context(), sb.ID))
	require.Equal(t, "DELETE /v1/boxes/"+sb.ID+"?force=true", s.calls[len(s.calls)-1])
	require.Empty(t, s.boxes)
}

func TestConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandboxtest.Harness {
		s, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
		byName := func(name string) int {
			s.mu.Lock()
			defer s.mu.Unlock()
			n := 0
			for _, b := range s.boxes {
				if b["name"] == name {
					n++
				}
			}
			return n
		}
		return sandboxtest.Harness{
			Provider:  newProvider(t, srv),
			Instances: func(t *testing.T, taskID string) int { return byName(sandbox.Name(taskID)) },
			// BoxLite has no wall-clock limit and no labels: the reaper
			// enforces Spec.Deadline.
			Deadline: nil,
			Residue: func(t *testing.T, taskID, id string) []string {
				if byName(sandbox.Name(taskID)) > 0 {
					return []string{"box " + sandbox.Name(taskID)}
				}
				return nil
			},
			Foreign: func(t *testing.T) {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.boxes = append(s.boxes, map[string]any{"box_id": "01JOTHER", "name": "dev-box", "status": "running",
					"created_at": "2026-11-20T09:00:00Z", "updated_at": "2026-11-20T09:00:00Z", "image": "alpine", "cpus": 1, "memory_mib": 512})
			},
		}
	})
}

// TestThrottledCreateIsRetried: boxlite serve behind a rate-limiting proxy
// answers 429 with Retry-After; the create is sent again after it.
func TestThrottledCreateIsRetried(t *testing.T) {
	s, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
	s.throttle = 1
	p := newProvider(t, srv)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	require.Equal(t, sandbox.StateRunning, sb.State)
	require.Len(t, s.boxes, 1)
	require.Equal(t, 2, slices.Index(s.calls, "POST /v1/boxes"), "GET /v1/me, GET the box, then the create")
	require.Equal(t, "POST /v1/boxes", s.calls[3], "sent again after the 429")
}

func TestErrorMapping(t *testing.T) {
	t.Run("image pull failure", func(t *testing.T) {
		s, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
		p := newProvider(t, srv)
		s.failCreate = &apiErr{http.StatusUnprocessableEntity, "ImageError", "image error: failed to pull ghcr.io/acme/runner:1"}
		_, err := p.Create(t.Context(), testSpec())
		require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
		require.ErrorContains(t, err, "HTTP 422 ImageError: image error: failed to pull")
	})
	t.Run("wrong api key", func(t *testing.T) {
		_, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
		p, err := boxlite.New(boxlite.Config{URL: srv.URL, APIKey: "wrong", Image: "runner:1"}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		_, err = p.Create(t.Context(), testSpec())
		require.ErrorIs(t, err, sandbox.ErrUnauthorized)
		require.ErrorContains(t, err, "invalid or missing API key")
		require.NotContains(t, err.Error(), "wrong")
	})
	t.Run("empty task id", func(t *testing.T) {
		s, srv := newServe(t, map[string]any{"path_prefix": nil}, "")
		p := newProvider(t, srv)
		spec := testSpec()
		spec.TaskID = ""
		_, err := p.Create(t.Context(), spec)
		require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
		require.Empty(t, s.calls)
	})
}

func TestConfigValidate(t *testing.T) {
	ok := boxlite.Config{URL: "http://127.0.0.1:8100", Image: "runner:1"}
	tests := []struct {
		name string
		edit func(*boxlite.Config)
		want string
	}{
		{"ok", func(*boxlite.Config) {}, ""},
		{"ok with prefix", func(c *boxlite.Config) { c.Prefix = "default" }, ""},
		{"missing url", func(c *boxlite.Config) { c.URL = "" }, "boxlite provider: URL (where boxlite serve listens, e.g. http://127.0.0.1:8100) is required"},
		{"bad url", func(c *boxlite.Config) { c.URL = "127.0.0.1:8100" }, `boxlite provider: URL "127.0.0.1:8100" is not an http(s) URL`},
		{"missing image", func(c *boxlite.Config) { c.Image = "" }, "boxlite provider: Image (the runner image) is required"},
		{"bad prefix", func(c *boxlite.Config) { c.Prefix = "a/b" }, `boxlite provider: Prefix "a/b" must be a single path segment`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.edit
			c := ok
			cfg(&c)
			err := c.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.want)
			_, err = boxlite.New(c, nil)
			require.EqualError(t, err, tt.want)
		})
	}
}
