package kubernetes

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// apiServer stands in for the Kubernetes API server for the batch/v1 Job,
// v1 Pod and v1 Secret calls the provider makes. It speaks the real wire
// format (TLS, bearer tokens, typed JSON with apiVersion/kind, List
// objects, labelSelector queries, DeleteOptions bodies, Status errors,
// 429 with Retry-After), so client-go talks to it as to a cluster.
type apiServer struct {
	mu      sync.Mutex
	jobs    map[string]*batchv1.Job
	pods    map[string]*corev1.Pod
	secrets map[string]*corev1.Secret
	calls   []string // "METHOD path" (lists: "METHOD path?query")
	// patchTypes holds the content types of the merge patches to secrets.
	patchTypes []string
	// deletes holds the DeleteOptions of each DELETE of a Job.
	deletes []metav1.DeleteOptions
	auth    []string
	// tokens are the bearer tokens the server accepts.
	tokens map[string]bool
	// hideJobOnce makes the next GET of a job 404 although it exists,
	// as when a concurrent Create wins between our GET and POST.
	hideJobOnce bool
	// fail answers the first request whose "METHOD path" starts with key.
	fail map[string]metav1.Status
	// throttle answers the next n requests whose "METHOD path" starts
	// with key with 429 and Retry-After: 1, as API priority and fairness
	// does under load.
	throttle map[string]int
	uid      int
	// now stamps creationTimestamp.
	now func() time.Time

	url    string
	caFile string
}

func newAPIServer(t *testing.T) *apiServer {
	t.Helper()
	a := &apiServer{jobs: map[string]*batchv1.Job{}, pods: map[string]*corev1.Pod{}, secrets: map[string]*corev1.Secret{},
		fail: map[string]metav1.Status{}, throttle: map[string]int{}, tokens: map[string]bool{k8sTok: true},
		now: func() time.Time { return now }}
	mux := http.NewServeMux()
	jobs := "/apis/batch/v1/namespaces/{ns}/jobs"
	pods := "/api/v1/namespaces/{ns}/pods"
	secrets := "/api/v1/namespaces/{ns}/secrets"
	mux.HandleFunc("GET "+jobs, a.wrap(a.listJobs))
	mux.HandleFunc("POST "+jobs, a.wrap(a.createJob))
	mux.HandleFunc("GET "+jobs+"/{name}", a.wrap(a.getJob))
	mux.HandleFunc("DELETE "+jobs+"/{name}", a.wrap(a.deleteJob))
	mux.HandleFunc("GET "+pods, a.wrap(a.listPods))
	mux.HandleFunc("POST "+secrets, a.wrap(a.createSecret))
	mux.HandleFunc("PUT "+secrets+"/{name}", a.wrap(a.replaceSecret))
	mux.HandleFunc("PATCH "+secrets+"/{name}", a.wrap(a.patchSecret))
	mux.HandleFunc("DELETE "+secrets+"/{name}", a.wrap(a.deleteSecret))
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	a.url = srv.URL
	a.caFile = filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(a.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	return a
}

func newTestProvider(t *testing.T, a *apiServer, edit ...func(*Config)) *Provider {
	t.Helper()
	cfg := Config{APIServer: a.url, CAFile: a.caFile, Token: k8sTok, Namespace: ns, Image: "ghcr.io/acme/runner:1",
		RuntimeClassName: "kata-qemu", TTLSecondsAfterFinished: 300}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := New(cfg, nil)
	require.NoError(t, err)
	p.now = a.now
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
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !a.tokens[tok] {
			writeStatus(w, status(http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized"))
			return
		}
		if r.PathValue("ns") != ns {
			writeStatus(w, status(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("namespaces %q not found", r.PathValue("ns"))))
			return
		}
		for prefix, n := range a.throttle {
			if n > 0 && strings.HasPrefix(call, prefix) {
				a.throttle[prefix] = n - 1
				w.Header().Set("Retry-After", "1")
				writeStatus(w, status(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "Too many requests, please try again later."))
				return
			}
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

// decode reads a typed object and insists on its apiVersion and kind, as
// the API server does.
func decode(w http.ResponseWriter, r *http.Request, apiVersion, kind string, v any) bool {
	b, err := io.ReadAll(r.Body)
	if err == nil {
		var tm metav1.TypeMeta
		if err = json.Unmarshal(b, &tm); err == nil && (tm.APIVersion != apiVersion || tm.Kind != kind) {
			err = fmt.Errorf("expected %s %s, got %q %q", apiVersion, kind, tm.APIVersion, tm.Kind)
		}
	}
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		writeStatus(w, status(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error()))
		return false
	}
	return true
}

func selector(w http.ResponseWriter, r *http.Request) (labels.Selector, bool) {
	sel, err := labels.Parse(r.URL.Query().Get("labelSelector"))
	if err != nil {
		writeStatus(w, status(http.StatusBadRequest, metav1.StatusReasonBadRequest, "unable to parse requirement: "+err.Error()))
		return nil, false
	}
	return sel, true
}

func (a *apiServer) createJob(w http.ResponseWriter, r *http.Request) {
	var job batchv1.Job
	if !decode(w, r, "batch/v1", "Job", &job) {
		return
	}
	if _, ok := a.jobs[job.Name]; ok {
		writeStatus(w, status(http.StatusConflict, metav1.StatusReasonAlreadyExists, fmt.Sprintf("jobs.batch %q already exists", job.Name)))
		return
	}
	job.Namespace = r.PathValue("ns")
	job.UID = a.nextUID()
	job.ResourceVersion = "1"
	job.CreationTimestamp = metav1.NewTime(a.now().Truncate(time.Second))
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
	sel, ok := selector(w, r)
	if !ok {
		return
	}
	list := batchv1.JobList{TypeMeta: metav1.TypeMeta{Kind: "JobList", APIVersion: "batch/v1"}, ListMeta: metav1.ListMeta{ResourceVersion: "7"},
		Items: []batchv1.Job{}}
	for _, job := range a.jobs {
		if sel.Matches(labels.Set(job.Labels)) {
			list.Items = append(list.Items, *job)
		}
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *apiServer) listPods(w http.ResponseWriter, r *http.Request) {
	a.calls[len(a.calls)-1] += "?" + r.URL.RawQuery
	sel, ok := selector(w, r)
	if !ok {
		return
	}
	list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: []corev1.Pod{}}
	for _, pod := range a.pods {
		if sel.Matches(labels.Set(pod.Labels)) {
			list.Items = append(list.Items, *pod)
		}
	}
	writeJSON(w, http.StatusOK, list)
}

// runPod adds the pod the Job controller would create for job, its
// runner container terminated with exit code.
func (a *apiServer) runPod(job string, exit int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	name := job + "-x7k2p"
	a.pods[name] = &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{labelJobName: job, "job-name": job}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
			Name: ContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Error"}},
		}}},
	}
}

func (a *apiServer) deleteJob(w http.ResponseWriter, r *http.Request) {
	// client-go sends DeleteOptions as the body; kubectl and curl users
	// put them in the query. The API server takes either.
	opts := metav1.DeleteOptions{}
	if b, _ := io.ReadAll(r.Body); len(b) > 0 {
		if err := json.Unmarshal(b, &opts); err != nil {
			writeStatus(w, status(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error()))
			return
		}
	}
	if pp := r.URL.Query().Get("propagationPolicy"); pp != "" {
		p := metav1.DeletionPropagation(pp)
		opts.PropagationPolicy = &p
	}
	a.deletes = append(a.deletes, opts)
	name := r.PathValue("name")
	job, ok := a.jobs[name]
	if !ok {
		writeStatus(w, status(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("jobs.batch %q not found", name)))
		return
	}
	delete(a.jobs, name)
	// Background propagation: the garbage collector removes the pods (and
	// the Secret the Job owns); without it the pods are orphaned.
	if opts.PropagationPolicy != nil && *opts.PropagationPolicy != metav1.DeletePropagationOrphan {
		for n, pod := range a.pods {
			if pod.Labels[labelJobName] == name {
				delete(a.pods, n)
			}
		}
		for n, s := range a.secrets {
			for _, o := range s.OwnerReferences {
				if o.UID == job.UID {
					delete(a.secrets, n)
				}
			}
		}
	}
	writeJSON(w, http.StatusOK, job)
}

func (a *apiServer) createSecret(w http.ResponseWriter, r *http.Request) {
	var s corev1.Secret
	if !decode(w, r, "v1", "Secret", &s) {
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
	if !decode(w, r, "v1", "Secret", &s) {
		return
	}
	if s.Name != r.PathValue("name") {
		writeStatus(w, status(http.StatusBadRequest, metav1.StatusReasonBadRequest, "the name of the object does not match the name on the URL"))
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
	a.patchTypes = append(a.patchTypes, r.Header.Get("Content-Type"))
	if r.Header.Get("Content-Type") != "application/merge-patch+json" {
		writeStatus(w, status(http.StatusUnsupportedMediaType, metav1.StatusReasonUnsupportedMediaType, "the body of the request was in an unknown format"))
		return
	}
	var patch struct {
		Metadata struct {
			OwnerReferences []metav1.OwnerReference `json:"ownerReferences"`
		} `json:"metadata"`
	}
	if err := json.NewDecoder(r.Body).Decode(&patch); err != nil {
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
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.calls {
		if c == call {
			n++
		}
	}
	return n
}

// jobDeadline is when the Job controller fails the Job: its start plus
// activeDeadlineSeconds (the stand-in starts Jobs at creation).
func (a *apiServer) jobDeadline(t *testing.T, name string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	job := a.jobs[name]
	require.NotNil(t, job)
	require.NotNil(t, job.Spec.ActiveDeadlineSeconds)
	return job.CreationTimestamp.Add(time.Duration(*job.Spec.ActiveDeadlineSeconds) * time.Second)
}
