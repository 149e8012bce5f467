package kubernetes

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/taskrunner/taskrunner/services/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	ns      = "sandboxes"
	k8sTok  = "k8s-token"
	taskID  = "0b7c6f3e-1d2a-4c5b-9e8f-123456789abc"
	jobName = "taskrunner-0b7c6f3e-1d2a-4c5b-9e8f-123456789abc"
)

var now = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

// apiServer is a fake Kubernetes API server for the batch/v1 Job and
// v1 Secret calls the provider makes, answering with the API server's
// paths, objects and Status errors.
type apiServer struct {
	mu      sync.Mutex
	jobs    map[string]*batchv1.Job
	secrets map[string]*corev1.Secret
	calls   []string // "METHOD path?query"
	// patches holds the merge patches sent to secrets, with content type.
	patches     []string
	patchTypes  []string
	deleteQuery []url.Values
	auth        []string
	// hideJobOnce makes the next GET of a job 404 although it exists,
	// as when a concurrent Create wins between our GET and POST.
	hideJobOnce bool
	// fail answers the first request whose "METHOD path" starts with key.
	fail map[string]metav1.Status
	uid  int
}

func newAPIServer(t *testing.T) (*apiServer, *httptest.Server) {
	t.Helper()
	a := &apiServer{jobs: map[string]*batchv1.Job{}, secrets: map[string]*corev1.Secret{}, fail: map[string]metav1.Status{}}
	mux := http.NewServeMux()
	jobs := "/apis/batch/v1/namespaces/{ns}/jobs"
	secrets := "/api/v1/namespaces/{ns}/secrets"
	mux.HandleFunc("GET "+jobs, a.wrap(a.listJobs))
	mux.HandleFunc("POST "+jobs, a.wrap(a.createJob))
	mux.HandleFunc("GET "+jobs+"/{name}", a.wrap(a.getJob))
	mux.HandleFunc("DELETE "+jobs+"/{name}", a.wrap(a.deleteJob))
	mux.HandleFunc("POST "+secrets, a.wrap(a.createSecret))
	mux.HandleFunc("PUT "+secrets+"/{name}", a.wrap(a.replaceSecret))
	mux.HandleFunc("PATCH "+secrets+"/{name}", a.wrap(a.patchSecret))
	mux.HandleFunc("DELETE "+secrets+"/{name}", a.wrap(a.deleteSecret))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return a, srv
}

func newTestProvider(t *testing.T, srv *httptest.Server, edit ...func(*Config)) *Provider {
	t.Helper()
	cfg := Config{APIServer: srv.URL, Token: k8sTok, Namespace: ns, Image: "ghcr.io/acme/runner:1",
		RuntimeClassName: "kata-qemu", TTLSecondsAfterFinished: 300}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := New(cfg, nil)
	require.NoError(t, err)
	p.now = func() time.Time { return now }
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func status(code int, reason metav1.StatusReason, msg string) metav1.Status {
	return metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: int32(code), Reason: reason, Message: msg}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeStatus(w http.ResponseWriter, st metav1.Status) { writeJSON(w, int(st.Code), st) }

func (a *apiServer) wrap(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		call := r.Method + " " + r.URL.Path
		a.calls = append(a.calls, call)
		a.auth = append(a.auth, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") != "Bearer "+k8sTok {
			writeStatus(w, status(http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized"))
			return
		}
		if r.PathValue("ns") != ns {
			writeStatus(w, status(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("namespaces %q not found", r.PathValue("ns"))))
			return
		}
		for prefix, st := range a.fail {
			if strings.HasPrefix(call, prefix) {
				delete(a.fail, prefix)
				writeStatus(w, st)
				return
			}
		}
		h(w, r)
	}
}

func (a *apiServer) nextUID() types.UID {
	a.uid++
	return types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", a.uid))
}

func (a *apiServer) createJob(w http.ResponseWriter, r *http.Request) {
	var job batchv1.Job
	if err := json.NewDecoder(r.Body).Decode(&job); err != nil {
		writeStatus(w, status(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error()))
		return
	}
	if _, ok := a.jobs[job.Name]; ok {
		writeStatus(w, status(http.StatusConflict, metav1.StatusReasonAlreadyExists, fmt.Sprintf("jobs.batch %q already exists", job.Name)))
		return
	}
	job.UID = a.nextUID()
	job.ResourceVersion = "1"
	job.CreationTimestamp = metav1.NewTime(now)
	a.jobs[job.Name] = &job
	writeJSON(w, http.StatusCreated, &job)
}

func (a *apiServer) getJob(w http.ResponseWriter, r *http.Request) {
	job, ok := a.jobs[r.PathValue("name")]
	if !ok || a.hideJobOnce {
		a.hideJobOnce = false
		writeStatus(w, status(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("jobs.batch %q not found", r.PathValue("name"))))
		return
	}
	writeJSON(w, http.StatusOK, job)
}

func (a *apiServer) listJobs(w http.ResponseWriter, r *http.Request) {
	a.calls[len(a.calls)-1] += "?" + r.URL.RawQuery
	list := batchv1.JobList{TypeMeta: metav1.TypeMeta{Kind: "JobList", APIVersion: "batch/v1"}}
	sel := r.URL.Query().Get("labelSelector")
	for _, job := range a.jobs {
		match := true
		for term := range strings.SplitSeq(sel, ",") {
			k, v, _ := strings.Cut(term, "=")
			if term != "" && job.Labels[k] != v {
				match = false
			}
		}
		if match {
			list.Items = append(list.Items, *job)
		}
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *apiServer) deleteJob(w http.ResponseWriter, r *http.Request) {
	a.deleteQuery = append(a.deleteQuery, r.URL.Query())
	if _, ok := a.jobs[r.PathValue("name")]; !ok {
		writeStatus(w, status(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("jobs.batch %q not found", r.PathValue("name"))))
		return
	}
	delete(a.jobs, r.PathValue("name"))
	writeJSON(w, http.StatusOK, status(http.StatusOK, "", ""))
}

func (a *apiServer) createSecret(w http.ResponseWriter, r *http.Request) {
	var s corev1.Secret
	if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
		writeStatus(w, status(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error()))
		return
	}
	if _, ok := a.secrets[s.Name]; ok {
		writeStatus(w, status(http.StatusConflict, metav1.StatusReasonAlreadyExists, fmt.Sprintf("secrets %q already exists", s.Name)))
		return
	}
	s.UID = a.nextUID()
	a.secrets[s.Name] = &s
	writeJSON(w, http.StatusCreated, &s)
}

func (a *apiServer) replaceSecret(w http.ResponseWriter, r *http.Request) {
	var s corev1.Secret
	if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
		writeStatus(w, status(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error()))
		return
	}
	a.secrets[s.Name] = &s
	writeJSON(w, http.StatusOK, &s)
}

func (a *apiServer) patchSecret(w http.ResponseWriter, r *http.Request) {
	s, ok := a.secrets[r.PathValue("name")]
	if !ok {
		writeStatus(w, status(http.StatusNotFound, metav1.StatusReasonNotFound, "secrets not found"))
		return
	}
	b, _ := io.ReadAll(r.Body)
	a.patches = append(a.patches, string(b))
	a.patchTypes = append(a.patchTypes, r.Header.Get("Content-Type"))
	var patch struct {
		Metadata struct {
			OwnerReferences []metav1.OwnerReference `json:"ownerReferences"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &patch); err != nil {
		writeStatus(w, status(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error()))
		return
	}
	s.OwnerReferences = patch.Metadata.OwnerReferences
	writeJSON(w, http.StatusOK, s)
}

func (a *apiServer) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if _, ok := a.secrets[r.PathValue("name")]; !ok {
		writeStatus(w, status(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("secrets %q not found", r.PathValue("name"))))
		return
	}
	delete(a.secrets, r.PathValue("name"))
	writeJSON(w, http.StatusOK, status(http.StatusOK, "", ""))
}

func (a *apiServer) count(call string) int {
	n := 0
	for _, c := range a.calls {
		if c == call {
			n++
		}
	}
	return n
}

func testSpec() sandbox.Spec {
	return sandbox.Spec{
		TaskID:   taskID,
		Owner:    "alice@example.com",
		Command:  []string{"/usr/local/bin/runner"},
		Env:      map[string]string{"TASKRUNNER_TASK_ID": taskID, "TASKRUNNER_EVENTS_ADDR": "cp.taskrunner.svc:9443", "TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		CPUs:     1.5,
		MemoryMB: 2048,
		Deadline: now.Add(2 * time.Hour),
		Labels:   map[string]string{"taskrunner.repo": "acme/widgets"},
	}
}

func TestCreateSendsExactJobAndSecret(t *testing.T) {
	a, srv := newAPIServer(t)
	p := newTestProvider(t, srv)
	spec := testSpec()

	sb, err := p.Create(t.Context(), spec)
	require.NoError(t, err)

	jobs := "/apis/batch/v1/namespaces/sandboxes/jobs"
	secrets := "/api/v1/namespaces/sandboxes/secrets"
	require.Equal(t, []string{
		"GET " + jobs + "/" + jobName,
		"POST " + secrets, // the Secret exists before the Job's pod can start
		"POST " + jobs,
		"PATCH " + secrets + "/" + jobName,
	}, a.calls)
	require.Equal(t, "Bearer "+k8sTok, a.auth[0])

	// The Secret carries exactly Spec.Env.
	secret := a.secrets[jobName]
	require.NotNil(t, secret)
	require.Equal(t, spec.Env, secret.StringData)
	for k := range secret.StringData {
		require.NotContains(t, strings.ToUpper(k), "GITHUB_TOKEN")
		require.NotContains(t, strings.ToUpper(k), "GH_TOKEN")
	}
	require.Equal(t, corev1.SecretTypeOpaque, secret.Type)
	require.Equal(t, ns, secret.Namespace)

	job := a.jobs[jobName]
	require.NotNil(t, job)
	wantLabels := map[string]string{
		sandbox.LabelTaskID:    taskID,
		sandbox.LabelOwner:     "alice_example.com", // '@' is not allowed in a label value
		sandbox.LabelManagedBy: "taskrunner",
		"taskrunner.repo":      "acme_widgets",
	}
	require.Equal(t, wantLabels, job.Labels)
	require.Equal(t, wantLabels, job.Spec.Template.Labels)
	require.Equal(t, wantLabels, secret.Labels)
	require.JSONEq(t, `{"taskrunner.task-id":"`+taskID+`","taskrunner.owner":"alice@example.com","taskrunner.managed-by":"taskrunner","taskrunner.repo":"acme/widgets"}`,
		job.Annotations[AnnotationLabels])
	require.Equal(t, "2026-11-20T12:00:00Z", job.Annotations[AnnotationDeadline])

	require.Equal(t, ns, job.Namespace)
	require.Equal(t, int32(0), *job.Spec.BackoffLimit)
	require.Equal(t, int64(7200), *job.Spec.ActiveDeadlineSeconds)
	require.Equal(t, int32(300), *job.Spec.TTLSecondsAfterFinished)
	pod := job.Spec.Template.Spec
	require.Equal(t, corev1.RestartPolicyNever, pod.RestartPolicy)
	require.Equal(t, "kata-qemu", *pod.RuntimeClassName)
	require.False(t, *pod.AutomountServiceAccountToken)
	require.False(t, *pod.EnableServiceLinks)
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	require.Equal(t, "runner", c.Name)
	require.Equal(t, "ghcr.io/acme/runner:1", c.Image)
	require.Equal(t, []string{"/usr/local/bin/runner"}, c.Command)
	require.Empty(t, c.Env, "the environment comes only from the Secret")
	require.Equal(t, []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: jobName}}}}, c.EnvFrom)
	require.Equal(t, "1500m", c.Resources.Limits.Cpu().String())
	require.Equal(t, "2Gi", c.Resources.Limits.Memory().String())

	// The Secret is handed to the Job, so it is deleted with it.
	require.Equal(t, []string{"application/merge-patch+json"}, a.patchTypes)
	require.Equal(t, []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: jobName, UID: job.UID}}, secret.OwnerReferences)

	require.Equal(t, jobName, sb.ID)
	require.Equal(t, "kubernetes", sb.Provider)
	require.Equal(t, sandbox.StatePending, sb.State)
	require.Equal(t, "alice@example.com", sb.Labels[sandbox.LabelOwner])
	require.Equal(t, taskID, sb.TaskID())
	require.Equal(t, now, sb.CreatedAt)
}

func TestCreateIsIdempotentPerTask(t *testing.T) {
	a, srv := newAPIServer(t)
	p := newTestProvider(t, srv)
	first, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	second, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)

	require.Equal(t, first.ID, second.ID)
	require.Equal(t, 1, a.count("POST /apis/batch/v1/namespaces/sandboxes/jobs"))
	require.Equal(t, 1, a.count("POST /api/v1/namespaces/sandboxes/secrets"))
}

func TestCreateLosingARaceReturnsTheWinner(t *testing.T) {
	a, srv := newAPIServer(t)
	p := newTestProvider(t, srv)
	first, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)

	a.hideJobOnce = true // our GET misses the Job, our POST hits AlreadyExists
	second, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	require.Equal(t, first.ID, second.ID)
	require.Len(t, a.jobs, 1)
	// The leftover Secret was replaced, not duplicated.
	require.Equal(t, 1, a.count("PUT /api/v1/namespaces/sandboxes/secrets/"+jobName))
	require.Equal(t, testSpec().Env, a.secrets[jobName].StringData)
}

func TestCreateFailureCleansUpTheSecret(t *testing.T) {
	a, srv := newAPIServer(t)
	p := newTestProvider(t, srv)
	a.fail["POST /apis/batch/v1/namespaces/sandboxes/jobs"] = status(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
		`Job.batch "x" is invalid: spec.template.spec.runtimeClassName: Invalid value`)

	_, err := p.Create(t.Context(), testSpec())
	require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
	require.ErrorContains(t, err, "runtimeClassName")
	require.Empty(t, a.secrets)
	require.Empty(t, a.jobs)
}

func TestCreateRejectsAPassedDeadline(t *testing.T) {
	a, srv := newAPIServer(t)
	p := newTestProvider(t, srv)
	spec := testSpec()
	spec.Deadline = now.Add(-time.Second)
	_, err := p.Create(t.Context(), spec)
	require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
	require.Empty(t, a.secrets)
	require.Empty(t, a.jobs)
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name string
		fail string
		st   metav1.Status
		want error
	}{
		{"quota", "POST /apis/batch", status(http.StatusForbidden, metav1.StatusReasonForbidden,
			`jobs.batch "x" is forbidden: exceeded quota: compute, requested: limits.cpu=2, used: limits.cpu=8, limited: limits.cpu=8`), sandbox.ErrCapacity},
		{"forbidden", "GET /apis/batch", status(http.StatusForbidden, metav1.StatusReasonForbidden,
			`jobs.batch is forbidden: User "system:serviceaccount:cp:taskrunner" cannot get resource "jobs"`), sandbox.ErrUnauthorized},
		{"unauthorized", "GET /apis/batch", status(http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized"), sandbox.ErrUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, srv := newAPIServer(t)
			p := newTestProvider(t, srv)
			a.fail[tt.fail] = tt.st
			_, err := p.Create(t.Context(), testSpec())
			require.ErrorIs(t, err, tt.want)
			require.ErrorContains(t, err, tt.st.Message)
		})
	}
	t.Run("missing namespace", func(t *testing.T) {
		_, srv := newAPIServer(t)
		p := newTestProvider(t, srv, func(c *Config) { c.Namespace = "other" })
		_, err := p.Create(t.Context(), testSpec())
		require.ErrorIs(t, err, sandbox.ErrNotFound)
		require.ErrorContains(t, err, `namespaces "other" not found`)
	})
}

func TestGetMapsJobStatus(t *testing.T) {
	cond := func(t batchv1.JobConditionType) []batchv1.JobCondition {
		return []batchv1.JobCondition{{Type: t, Status: corev1.ConditionTrue, Reason: "x"}}
	}
	tests := []struct {
		name     string
		status   batchv1.JobStatus
		deleting bool
		want     sandbox.State
		wantCode *int
	}{
		{"no pod yet", batchv1.JobStatus{}, false, sandbox.StatePending, nil},
		{"pod not ready", batchv1.JobStatus{Active: 1, Ready: ptr(int32(0))}, false, sandbox.StatePending, nil},
		{"running", batchv1.JobStatus{Active: 1, Ready: ptr(int32(1))}, false, sandbox.StateRunning, nil},
		{"complete", batchv1.JobStatus{Succeeded: 1, Conditions: cond(batchv1.JobComplete)}, false, sandbox.StateExited, ptr(0)},
		{"failed", batchv1.JobStatus{Failed: 1, Conditions: cond(batchv1.JobFailed)}, false, sandbox.StateExited, nil},
		{"being deleted", batchv1.JobStatus{Active: 1}, true, sandbox.StateGone, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, srv := newAPIServer(t)
			p := newTestProvider(t, srv)
			sb, err := p.Create(t.Context(), testSpec())
			require.NoError(t, err)
			a.jobs[jobName].Status = tt.status
			if tt.deleting {
				a.jobs[jobName].DeletionTimestamp = ptr(metav1.NewTime(now))
			}
			got, err := p.Get(t.Context(), sb.ID)
			require.NoError(t, err)
			require.Equal(t, tt.want, got.State)
			require.Equal(t, tt.wantCode, got.ExitCode)
		})
	}
	t.Run("missing", func(t *testing.T) {
		_, srv := newAPIServer(t)
		p := newTestProvider(t, srv)
		_, err := p.Get(t.Context(), "taskrunner-nope")
		require.ErrorIs(t, err, sandbox.ErrNotFound)
		_, err = p.Get(t.Context(), "../../secrets")
		require.ErrorIs(t, err, sandbox.ErrNotFound)
	})
}

func TestListUsesLabelSelector(t *testing.T) {
	a, srv := newAPIServer(t)
	p := newTestProvider(t, srv)
	b := testSpec()
	b.TaskID, b.Owner = "task-b", "bob"
	_, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	_, err = p.Create(t.Context(), b)
	require.NoError(t, err)

	tests := []struct {
		name      string
		labels    map[string]string
		wantQuery string
		wantTasks []string
	}{
		{"all of ours", nil, "labelSelector=taskrunner.managed-by%3Dtaskrunner", []string{taskID, "task-b"}},
		{"by owner", map[string]string{sandbox.LabelOwner: "alice@example.com"},
			"labelSelector=taskrunner.managed-by%3Dtaskrunner%2Ctaskrunner.owner%3Dalice_example.com", []string{taskID}},
		// Sanitised values may collide; the originals decide.
		{"sanitised collision", map[string]string{sandbox.LabelOwner: "alice#example.com"},
			"labelSelector=taskrunner.managed-by%3Dtaskrunner%2Ctaskrunner.owner%3Dalice_example.com", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := p.List(t.Context(), tt.labels)
			require.NoError(t, err)
			require.Equal(t, "GET /apis/batch/v1/namespaces/sandboxes/jobs?"+tt.wantQuery, a.calls[len(a.calls)-1])
			var tasks []string
			for _, sb := range got {
				tasks = append(tasks, sb.TaskID())
			}
			require.ElementsMatch(t, tt.wantTasks, tasks)
		})
	}
}

func TestDestroy(t *testing.T) {
	a, srv := newAPIServer(t)
	p := newTestProvider(t, srv)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)

	for _, tt := range []struct{ name, id string }{
		{"existing job", sb.ID},
		{"already gone", sb.ID},
		{"never existed", "taskrunner-nope"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, p.Destroy(t.Context(), tt.id))
			require.Equal(t, "Background", a.deleteQuery[len(a.deleteQuery)-1].Get("propagationPolicy"))
			require.Equal(t, "DELETE /api/v1/namespaces/sandboxes/secrets/"+tt.id, a.calls[len(a.calls)-1])
		})
	}
	require.Empty(t, a.jobs)
	require.Empty(t, a.secrets)
}

func TestTokenFileIsReadOnEveryRequest(t *testing.T) {
	a, srv := newAPIServer(t)
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("old-token\n"), 0o600))
	p := newTestProvider(t, srv, func(c *Config) { c.Token, c.TokenFile = "", file })

	_, err := p.List(t.Context(), nil)
	require.ErrorIs(t, err, sandbox.ErrUnauthorized)
	require.NoError(t, os.WriteFile(file, []byte(k8sTok+"\n"), 0o600)) // rotated
	_, err = p.List(t.Context(), nil)
	require.NoError(t, err)
	require.Equal(t, []string{"Bearer old-token", "Bearer " + k8sTok}, a.auth)
}

func TestConfigValidate(t *testing.T) {
	ok := Config{APIServer: "https://10.0.0.1:6443", Namespace: "sandboxes", Image: "runner:1"}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"ok with runtime class", func(c *Config) { c.RuntimeClassName = "gvisor" }, ""},
		{"missing namespace", func(c *Config) { c.Namespace = "" }, "kubernetes provider: Namespace is required"},
		{"bad namespace", func(c *Config) { c.Namespace = "Sand_boxes" }, `kubernetes provider: Namespace "Sand_boxes" is not a valid namespace name`},
		{"missing image", func(c *Config) { c.Image = "" }, "kubernetes provider: Image (the runner image) is required"},
		{"bad runtime class", func(c *Config) { c.RuntimeClassName = "Kata QEMU" }, `kubernetes provider: RuntimeClassName "Kata QEMU" is not a valid RuntimeClass name`},
		{"bad api server", func(c *Config) { c.APIServer = "10.0.0.1:6443" }, `kubernetes provider: APIServer "10.0.0.1:6443" is not an http(s) URL`},
		{"negative ttl", func(c *Config) { c.TTLSecondsAfterFinished = -1 }, "kubernetes provider: TTLSecondsAfterFinished must not be negative"},
		{"token and file", func(c *Config) { c.Token, c.TokenFile = "a", "/b" }, "kubernetes provider: set Token or TokenFile, not both"},
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
		})
	}
	t.Run("outside a cluster without APIServer", func(t *testing.T) {
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		cfg := ok
		cfg.APIServer = ""
		_, err := New(cfg, nil)
		require.EqualError(t, err, "kubernetes provider: APIServer is required when not running in a cluster (KUBERNETES_SERVICE_HOST/PORT are not set)")
	})
	t.Run("unreadable CA file", func(t *testing.T) {
		cfg := ok
		cfg.CAFile = filepath.Join(t.TempDir(), "missing.crt")
		_, err := New(cfg, nil)
		require.ErrorContains(t, err, "kubernetes provider: CAFile:")
	})
}

func TestCreateRefusesAnotherTasksJob(t *testing.T) {
	a, srv := newAPIServer(t)
	p := newTestProvider(t, srv)
	x := testSpec()
	x.TaskID = "Task_A"
	_, err := p.Create(t.Context(), x)
	require.NoError(t, err)

	y := testSpec()
	y.TaskID = "task-a" // same sandbox.Name
	_, err = p.Create(t.Context(), y)
	require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
	require.ErrorContains(t, err, `belongs to task "Task_A"`)
	require.Len(t, a.jobs, 1)
	require.Equal(t, x.Env, a.secrets["taskrunner-task-a"].StringData)
}
