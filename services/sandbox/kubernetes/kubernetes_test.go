package kubernetes

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	// klog, which client-go logs through, starts its flush daemon in init.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

const (
	ns      = "sandboxes"
	k8sTok  = "k8s-token"
	taskID  = "0b7c6f3e-1d2a-4c5b-9e8f-123456789abc"
	jobName = "taskrunner-0b7c6f3e-1d2a-4c5b-9e8f-123456789abc"
)

var now = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

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
	a := newAPIServer(t)
	p := newTestProvider(t, a)
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

func TestCreateLosingARaceReturnsTheWinner(t *testing.T) {
	a := newAPIServer(t)
	p := newTestProvider(t, a)
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
	a := newAPIServer(t)
	p := newTestProvider(t, a)
	a.fail["POST /apis/batch/v1/namespaces/sandboxes/jobs"] = status(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
		`Job.batch "x" is invalid: spec.template.spec.runtimeClassName: Invalid value`)

	_, err := p.Create(t.Context(), testSpec())
	require.ErrorIs(t, err, sandbox.ErrInvalidSpec)
	require.ErrorContains(t, err, "runtimeClassName")
	require.Empty(t, a.secrets)
	require.Empty(t, a.jobs)
}

func TestCreateRejectsAPassedDeadline(t *testing.T) {
	a := newAPIServer(t)
	p := newTestProvider(t, a)
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
			a := newAPIServer(t)
			p := newTestProvider(t, a)
			a.fail[tt.fail] = tt.st
			_, err := p.Create(t.Context(), testSpec())
			require.ErrorIs(t, err, tt.want)
			require.ErrorContains(t, err, tt.st.Message)
		})
	}
	t.Run("missing namespace", func(t *testing.T) {
		a := newAPIServer(t)
		p := newTestProvider(t, a, func(c *Config) { c.Namespace = "other" })
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
			a := newAPIServer(t)
			p := newTestProvider(t, a)
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
		a := newAPIServer(t)
		p := newTestProvider(t, a)
		_, err := p.Get(t.Context(), "taskrunner-nope")
		require.ErrorIs(t, err, sandbox.ErrNotFound)
		_, err = p.Get(t.Context(), "../../secrets")
		require.ErrorIs(t, err, sandbox.ErrNotFound)
	})
}

func TestListUsesLabelSelector(t *testing.T) {
	a := newAPIServer(t)
	p := newTestProvider(t, a)
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

func TestDestroyDeletesWithBackgroundPropagation(t *testing.T) {
	a := newAPIServer(t)
	p := newTestProvider(t, a)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	a.runPod(jobName, 1)

	require.NoError(t, p.Destroy(t.Context(), sb.ID))
	require.Len(t, a.deletes, 1)
	require.NotNil(t, a.deletes[0].PropagationPolicy, "without a propagation policy the API server orphans the pod")
	require.Equal(t, metav1.DeletePropagationBackground, *a.deletes[0].PropagationPolicy)
	require.Empty(t, a.jobs)
	require.Empty(t, a.pods)
	require.Empty(t, a.secrets)
	require.Equal(t, "DELETE /api/v1/namespaces/sandboxes/secrets/"+jobName, a.calls[len(a.calls)-1])
}

func TestTokenFileIsReadOnEveryRequest(t *testing.T) {
	a := newAPIServer(t)
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("old-token\n"), 0o600))
	p := newTestProvider(t, a, func(c *Config) { c.Token, c.TokenFile = "", file })

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
		{"context without kubeconfig", func(c *Config) { c.Context = "prod" }, "kubernetes provider: Context needs Kubeconfig"},
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
		require.EqualError(t, err, "kubernetes provider: APIServer or Kubeconfig is required when not running in a cluster (KUBERNETES_SERVICE_HOST/PORT are not set)")
	})
	t.Run("missing kubeconfig", func(t *testing.T) {
		cfg := ok
		cfg.Kubeconfig = filepath.Join(t.TempDir(), "missing")
		_, err := New(cfg, nil)
		require.ErrorContains(t, err, "kubernetes provider: Kubeconfig:")
	})
	t.Run("unreadable CA file", func(t *testing.T) {
		cfg := ok
		cfg.CAFile = filepath.Join(t.TempDir(), "missing.crt")
		_, err := New(cfg, nil)
		require.ErrorContains(t, err, "kubernetes provider: CAFile:")
	})
}

func TestCreateRefusesAnotherTasksJob(t *testing.T) {
	a := newAPIServer(t)
	p := newTestProvider(t, a)
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

// writeKubeconfig writes a kubeconfig for a's cluster whose user gets its
// token from an exec credential plugin: a shell script (built here, no
// network, no go run) that logs each call and prints an ExecCredential,
// as aws eks get-token or gke-gcloud-auth-plugin do.
func writeKubeconfig(t *testing.T, a *apiServer, token string) (kubeconfig, calls string) {
	t.Helper()
	dir := t.TempDir()
	calls = filepath.Join(dir, "plugin-calls")
	plugin := filepath.Join(dir, "credential-plugin")
	require.NoError(t, os.WriteFile(plugin, []byte(`#!/bin/sh
# KUBERNETES_EXEC_INFO tells the plugin which cluster asks.
printf '%s\n' "$KUBERNETES_EXEC_INFO" >> "`+calls+`"
cat <<JSON
{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"`+token+`"}}
JSON
`), 0o755))
	kubeconfig = filepath.Join(dir, "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
current-context: eks
clusters:
- name: eks
  cluster:
    server: `+a.url+`
    certificate-authority: `+a.caFile+`
users:
- name: eks-user
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: `+plugin+`
      args: ["token", "-i", "cluster"]
      interactiveMode: Never
      provideClusterInfo: true
contexts:
- name: eks
  context:
    cluster: eks
    user: eks-user
    namespace: ignored
`), 0o600))
	return kubeconfig, calls
}

func TestKubeconfigWithExecCredentialPlugin(t *testing.T) {
	a := newAPIServer(t)
	a.tokens = map[string]bool{"exec-token-1": true} // the static token is not accepted here
	kubeconfig, calls := writeKubeconfig(t, a, "exec-token-1")
	p := newTestProvider(t, a, func(c *Config) { c.APIServer, c.CAFile, c.Token, c.Kubeconfig = "", "", "", kubeconfig })

	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	require.Equal(t, jobName, sb.ID)
	list, err := p.List(t.Context(), nil)
	require.NoError(t, err)
	require.Len(t, list, 1)
	for _, h := range a.auth {
		require.Equal(t, "Bearer exec-token-1", h)
	}
	log, err := os.ReadFile(calls)
	require.NoError(t, err)
	require.GreaterOrEqual(t, strings.Count(string(log), "\n"), 1, "the plugin ran")
	require.Contains(t, string(log), `"kind":"ExecCredential"`)
	require.Contains(t, string(log), a.url, "provideClusterInfo hands the plugin the cluster's server")
	require.Equal(t, ns, a.jobs[jobName].Namespace, "the provider's namespace wins over the context's")
}

func TestKubeconfigRejectedTokenIsUnauthorized(t *testing.T) {
	a := newAPIServer(t)
	kubeconfig, _ := writeKubeconfig(t, a, "stolen")
	p := newTestProvider(t, a, func(c *Config) { c.APIServer, c.CAFile, c.Token, c.Kubeconfig = "", "", "", kubeconfig })
	_, err := p.List(t.Context(), nil)
	require.ErrorIs(t, err, sandbox.ErrUnauthorized)
	require.Equal(t, "Bearer stolen", a.auth[0])
}

func TestTooManyRequestsIsRetriedAfterRetryAfter(t *testing.T) {
	a := newAPIServer(t)
	p := newTestProvider(t, a)
	a.throttle["POST /apis/batch/v1/namespaces/sandboxes/jobs"] = 2

	start := time.Now()
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	require.Equal(t, jobName, sb.ID)
	require.Equal(t, 3, a.count("POST /apis/batch/v1/namespaces/sandboxes/jobs"), "two 429s, then the Job was created")
	require.GreaterOrEqual(t, time.Since(start), 2*time.Second, "client-go waited Retry-After (1s) before each retry")
	require.Len(t, a.jobs, 1)
}

func TestGetReadsTheExitCodeOfAFailedJobFromItsPod(t *testing.T) {
	a := newAPIServer(t)
	p := newTestProvider(t, a)
	sb, err := p.Create(t.Context(), testSpec())
	require.NoError(t, err)
	a.jobs[jobName].Status = batchv1.JobStatus{Failed: 1, Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue}}}
	a.runPod(jobName, 3)
	a.runPod("taskrunner-other", 9)
	a.pods["taskrunner-other-x7k2p"].Name = "other"
	got, err := p.Get(t.Context(), sb.ID)
	require.NoError(t, err)
	require.Equal(t, sandbox.StateExited, got.State)
	require.NotNil(t, got.ExitCode)
	require.Equal(t, 3, *got.ExitCode)
	require.Equal(t, "GET /api/v1/namespaces/sandboxes/pods?labelSelector=batch.kubernetes.io%2Fjob-name%3D"+jobName, a.calls[len(a.calls)-1])
}

func TestConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandboxtest.Harness {
		a := newAPIServer(t)
		a.now = time.Now
		p := newTestProvider(t, a)
		return sandboxtest.Harness{
			Provider: p,
			Instances: func(t *testing.T, taskID string) int {
				a.mu.Lock()
				defer a.mu.Unlock()
				n := 0
				for _, j := range a.jobs {
					if j.Labels[sandbox.LabelTaskID] == taskID {
						n++
					}
				}
				return n
			},
			Deadline: a.jobDeadline,
			Residue: func(t *testing.T, taskID, id string) []string {
				a.mu.Lock()
				defer a.mu.Unlock()
				var left []string
				for n, s := range a.secrets {
					if s.Labels[sandbox.LabelTaskID] == taskID || n == id {
						left = append(left, "secret "+n)
					}
				}
				for n, pod := range a.pods {
					if pod.Labels[labelJobName] == id {
						left = append(left, "pod "+n)
					}
				}
				if _, ok := a.jobs[id]; ok {
					left = append(left, "job "+id)
				}
				return left
			},
			Foreign: func(t *testing.T) {
				a.mu.Lock()
				defer a.mu.Unlock()
				a.jobs["nightly-backup"] = &batchv1.Job{TypeMeta: metav1.TypeMeta{Kind: "Job", APIVersion: "batch/v1"},
					ObjectMeta: metav1.ObjectMeta{Name: "nightly-backup", Namespace: ns, Labels: map[string]string{sandbox.LabelOwner: "alice"}}}
			},
		}
	})
}
