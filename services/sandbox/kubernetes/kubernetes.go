package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/taskrunner/taskrunner/services/sandbox"
)

// ProviderName is the configuration name of this provider.
const ProviderName = "kubernetes"

// Annotations the provider writes on Jobs.
const (
	// AnnotationLabels holds Spec.AllLabels as JSON: label values must be
	// Kubernetes label values (63 characters of [A-Za-z0-9._-]), so the
	// Job's labels are sanitised copies and this keeps the originals.
	AnnotationLabels = "taskrunner.labels"
	// AnnotationDeadline records Spec.Deadline (RFC 3339, UTC).
	AnnotationDeadline = "taskrunner.deadline"
)

// ContainerName is the name of the runner container in the Job's pod.
const ContainerName = "runner"

// DefaultTTLSecondsAfterFinished is used when Config leaves it zero.
const DefaultTTLSecondsAfterFinished = 600

// labelJobName is the label the Job controller puts on the Job's pods.
const labelJobName = "batch.kubernetes.io/job-name"

// Config configures the provider. The connection is resolved in this
// order: Kubeconfig when set (with APIServer, Token, TokenFile and CAFile
// overriding its cluster and user), else APIServer with Token / TokenFile
// / CAFile, else the in-cluster service account.
type Config struct {
	// Kubeconfig is a kubeconfig file. Its current context (or Context)
	// picks the cluster and user; users with an exec credential plugin
	// (aws eks get-token, gke-gcloud-auth-plugin, kubelogin) work.
	Kubeconfig string `env:"TASKRUNNER_K8S_KUBECONFIG"`
	// Context selects a kubeconfig context other than the current one.
	Context string `env:"TASKRUNNER_K8S_CONTEXT"`
	// APIServer is the API server URL (https://host:6443). Empty and no
	// Kubeconfig: the in-cluster address from KUBERNETES_SERVICE_HOST /
	// _PORT, with the pod's service-account token and CA.
	APIServer string `env:"TASKRUNNER_K8S_API_SERVER"`
	// Token is a bearer token. TokenFile is read on every request instead
	// (projected tokens rotate). Neither: no Authorization header (e.g.
	// behind kubectl proxy), except in-cluster or from a kubeconfig.
	Token     string `env:"TASKRUNNER_K8S_TOKEN"`
	TokenFile string `env:"TASKRUNNER_K8S_TOKEN_FILE"`
	// CAFile verifies the API server's certificate. Empty: system roots
	// (or the kubeconfig's certificate-authority).
	CAFile string `env:"TASKRUNNER_K8S_CA_FILE"`
	// Namespace the Jobs and Secrets are created in. Required.
	Namespace string `env:"TASKRUNNER_K8S_NAMESPACE"`
	// Image is the runner image used when Spec.Image is empty. Required.
	Image string `env:"TASKRUNNER_K8S_IMAGE"`
	// RuntimeClassName selects a node.k8s.io RuntimeClass (e.g. "kata-qemu",
	// "gvisor"). Empty: the cluster's default runtime.
	RuntimeClassName string `env:"TASKRUNNER_K8S_RUNTIME_CLASS"`
	// ServiceAccountName runs the pod as this service account (its token
	// is never mounted). Empty: the namespace default.
	ServiceAccountName string `env:"TASKRUNNER_K8S_SERVICE_ACCOUNT"`
	// TTLSecondsAfterFinished is how long a finished Job (and its pod and
	// Secret) is kept. Zero: DefaultTTLSecondsAfterFinished.
	TTLSecondsAfterFinished int32 `env:"TASKRUNNER_K8S_TTL_SECONDS_AFTER_FINISHED"`
}

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Namespace == "":
		return errors.New("kubernetes provider: Namespace is required")
	case len(c.Namespace) > 63 || !dnsLabel.MatchString(c.Namespace):
		return fmt.Errorf("kubernetes provider: Namespace %q is not a valid namespace name", c.Namespace)
	case strings.TrimSpace(c.Image) == "":
		return errors.New("kubernetes provider: Image (the runner image) is required")
	case c.RuntimeClassName != "" && (len(c.RuntimeClassName) > 253 || !dnsSubdomain.MatchString(c.RuntimeClassName)):
		return fmt.Errorf("kubernetes provider: RuntimeClassName %q is not a valid RuntimeClass name", c.RuntimeClassName)
	case c.ServiceAccountName != "" && (len(c.ServiceAccountName) > 253 || !dnsSubdomain.MatchString(c.ServiceAccountName)):
		return fmt.Errorf("kubernetes provider: ServiceAccountName %q is not a valid name", c.ServiceAccountName)
	case c.TTLSecondsAfterFinished < 0:
		return errors.New("kubernetes provider: TTLSecondsAfterFinished must not be negative")
	case c.Token != "" && c.TokenFile != "":
		return errors.New("kubernetes provider: set Token or TokenFile, not both")
	case c.Context != "" && c.Kubeconfig == "":
		return errors.New("kubernetes provider: Context needs Kubeconfig")
	}
	if c.APIServer != "" {
		u, err := url.Parse(c.APIServer)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("kubernetes provider: APIServer %q is not an http(s) URL", c.APIServer)
		}
	}
	return nil
}

// Provider is the Kubernetes Job sandbox provider.
type Provider struct {
	cfg  Config
	api  kubernetes.Interface
	http *http.Client
	log  *slog.Logger
	now  func() time.Time
}

var _ sandbox.Provider = (*Provider)(nil)

// New validates cfg, resolves the connection (kubeconfig, explicit
// server, or in-cluster) and builds a client-go clientset. It does not call
// the API server (an exec credential plugin runs on the first request).
func New(cfg Config, logger *slog.Logger) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.TTLSecondsAfterFinished == 0 {
		cfg.TTLSecondsAfterFinished = DefaultTTLSecondsAfterFinished
	}
	rc, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	// client-go throttles on the client side (5 QPS by default); one
	// Create makes four calls, so allow a burst of dispatches.
	rc.QPS, rc.Burst = 50, 100
	rc.UserAgent = "taskrunner"
	// The clientset defaults to protobuf for built-in types; JSON is what
	// every API server, proxy and audit log reads, and the handful of small
	// objects per task make the difference in size irrelevant.
	rc.ContentType, rc.AcceptContentTypes = "application/json", "application/json"
	if rc.Timeout == 0 {
		rc.Timeout = 30 * time.Second
	}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes provider: %w", err)
	}
	api, err := kubernetes.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes provider: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Provider{cfg: cfg, api: api, http: hc, log: logger.With("provider", ProviderName), now: time.Now}, nil
}

// restConfig turns cfg into a client-go configuration.
func restConfig(cfg Config) (*rest.Config, error) {
	var rc *rest.Config
	switch {
	case cfg.Kubeconfig != "":
		if _, err := os.Stat(cfg.Kubeconfig); err != nil {
			return nil, fmt.Errorf("kubernetes provider: Kubeconfig: %w", err)
		}
		over := &clientcmd.ConfigOverrides{CurrentContext: cfg.Context}
		over.ClusterInfo.Server = cfg.APIServer
		over.ClusterInfo.CertificateAuthority = cfg.CAFile
		over.AuthInfo.Token = cfg.Token
		over.AuthInfo.TokenFile = cfg.TokenFile
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: cfg.Kubeconfig}, over)
		c, err := loader.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes provider: Kubeconfig %s: %w", cfg.Kubeconfig, err)
		}
		rc = c
	case cfg.APIServer != "":
		rc = &rest.Config{Host: cfg.APIServer, BearerToken: cfg.Token}
		if cfg.CAFile != "" {
			if _, err := os.Stat(cfg.CAFile); err != nil {
				return nil, fmt.Errorf("kubernetes provider: CAFile: %w", err)
			}
			rc.TLSClientConfig.CAFile = cfg.CAFile
		}
	default:
		c, err := rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, errors.New("kubernetes provider: APIServer or Kubeconfig is required when not running in a cluster (KUBERNETES_SERVICE_HOST/PORT are not set)")
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes provider: in-cluster configuration: %w", err)
		}
		rc = c
		if cfg.CAFile != "" {
			rc.TLSClientConfig.CAFile = cfg.CAFile
		}
		if cfg.Token != "" {
			rc.BearerToken, rc.BearerTokenFile = cfg.Token, ""
		}
	}
	if cfg.TokenFile != "" {
		if _, err := os.Stat(cfg.TokenFile); err != nil {
			return nil, fmt.Errorf("kubernetes provider: TokenFile: %w", err)
		}
		// client-go caches a token file for a minute; a projected token
		// may rotate sooner than that, so it is read on every request.
		rc.BearerToken, rc.BearerTokenFile = "", ""
		file := cfg.TokenFile
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return tokenFile{file: file, next: rt} })
	}
	return rc, nil
}

// tokenFile sets the bearer token read from file on each request.
type tokenFile struct {
	file string
	next http.RoundTripper
}

func (t tokenFile) RoundTrip(req *http.Request) (*http.Response, error) {
	b, err := os.ReadFile(t.file)
	if err != nil {
		return nil, fmt.Errorf("read TokenFile: %w", err)
	}
	req = utilnet.CloneRequest(req)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
	return t.next.RoundTrip(req)
}

func (t tokenFile) WrappedRoundTripper() http.RoundTripper { return t.next }

// Close releases idle connections.
func (p *Provider) Close() error {
	utilnet.CloseIdleConnectionsFor(p.http.Transport)
	return nil
}

// Name implements sandbox.Provider.
func (p *Provider) Name() string { return ProviderName }

// Create implements sandbox.Provider. The Job and its Secret are both
// named sandbox.Name(TaskID), which makes Create idempotent: an existing
// Job is returned as it is.
func (p *Provider) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.TaskID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("kubernetes: %w: empty task id", sandbox.ErrInvalidSpec)
	}
	name := sandbox.Name(spec.TaskID)
	jobs := p.api.BatchV1().Jobs(p.cfg.Namespace)
	secrets := p.api.CoreV1().Secrets(p.cfg.Namespace)
	existing, err := jobs.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		return p.existing(existing, spec)
	}
	if !apierrors.IsNotFound(err) {
		return sandbox.Sandbox{}, mapErr("get job "+name, err)
	}

	job, err := p.job(name, spec)
	if err != nil {
		return sandbox.Sandbox{}, err
	}

	// The Secret first, so the pod never starts without its environment.
	// One left by an earlier, failed attempt is replaced: the Job that
	// will read it does not exist yet.
	secret := p.secret(name, spec)
	_, err = secrets.Create(ctx, secret, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
	}
	if err != nil {
		return sandbox.Sandbox{}, mapErr("create secret "+name, err)
	}

	created, err := jobs.Create(ctx, job, metav1.CreateOptions{})
	switch {
	case err == nil:
		p.log.InfoContext(ctx, "job created", "task_id", spec.TaskID, "job", name, "namespace", p.cfg.Namespace)
	case apierrors.IsAlreadyExists(err):
		// A concurrent Create won; its Job reads the Secret we replaced,
		// which holds the same task's environment.
		got, err := jobs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return sandbox.Sandbox{}, mapErr("get job "+name, err)
		}
		return p.existing(got, spec)
	default:
		p.deleteSecret(ctx, name)
		return sandbox.Sandbox{}, mapErr("create job "+name, err)
	}

	// Hand the Secret to the Job so the garbage collector deletes it with
	// the Job (TTL or Destroy). Destroy deletes it explicitly as well, so a
	// failure here only costs a leftover Secret until then.
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{{
		APIVersion: "batch/v1", Kind: "Job", Name: name, UID: created.UID,
	}}}})
	if _, err := secrets.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		p.log.WarnContext(ctx, "could not make the job own its secret", "job", name, "error", err)
	}
	return fromJob(created), nil
}

// existing returns the Job found under the task's name, unless it runs
// another task: sandbox.Name folds case and punctuation, so two task ids
// can share a name.
func (p *Provider) existing(job *batchv1.Job, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb := fromJob(job)
	if sb.TaskID() != spec.TaskID {
		return sandbox.Sandbox{}, fmt.Errorf("kubernetes: %w: job %s belongs to task %q, not %q", sandbox.ErrInvalidSpec, job.Name, sb.TaskID(), spec.TaskID)
	}
	return sb, nil
}

func (p *Provider) secret(name string, spec sandbox.Spec) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.cfg.Namespace, Labels: labelValues(spec.AllLabels())},
		Type:       corev1.SecretTypeOpaque,
		StringData: maps.Clone(spec.Env),
	}
}

func (p *Provider) job(name string, spec sandbox.Spec) (*batchv1.Job, error) {
	image := spec.Image
	if image == "" {
		image = p.cfg.Image
	}
	all := spec.AllLabels()
	original, _ := json.Marshal(all)
	labels := labelValues(all)
	annotations := map[string]string{AnnotationLabels: string(original)}

	js := batchv1.JobSpec{
		BackoffLimit:            ptr(int32(0)),
		TTLSecondsAfterFinished: ptr(p.cfg.TTLSecondsAfterFinished),
	}
	if !spec.Deadline.IsZero() {
		left := spec.Deadline.Sub(p.now())
		if left <= 0 {
			return nil, fmt.Errorf("kubernetes: %w: deadline %s has passed", sandbox.ErrInvalidSpec, spec.Deadline.UTC().Format(time.RFC3339))
		}
		js.ActiveDeadlineSeconds = ptr(int64(math.Ceil(left.Seconds())))
		annotations[AnnotationDeadline] = spec.Deadline.UTC().Format(time.RFC3339)
	}

	c := corev1.Container{
		Name:    ContainerName,
		Image:   image,
		Command: slices.Clone(spec.Command), // replaces the image's ENTRYPOINT
		EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: name},
		}}},
	}
	limits := corev1.ResourceList{}
	if spec.CPUs > 0 {
		limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(math.Round(spec.CPUs*1000)), resource.DecimalSI)
	}
	if spec.MemoryMB > 0 {
		limits[corev1.ResourceMemory] = *resource.NewQuantity(int64(spec.MemoryMB)<<20, resource.BinarySI)
	}
	if len(limits) > 0 {
		// Requests default to the limits.
		c.Resources.Limits = limits
	}

	pod := corev1.PodSpec{
		RestartPolicy:                corev1.RestartPolicyNever,
		AutomountServiceAccountToken: ptr(false),
		EnableServiceLinks:           ptr(false),
		ServiceAccountName:           p.cfg.ServiceAccountName,
		Containers:                   []corev1.Container{c},
	}
	if p.cfg.RuntimeClassName != "" {
		pod.RuntimeClassName = ptr(p.cfg.RuntimeClassName)
	}
	js.Template = corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{AnnotationLabels: string(original)}},
		Spec:       pod,
	}
	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.cfg.Namespace, Labels: labels, Annotations: annotations},
		Spec:       js,
	}, nil
}

// Get implements sandbox.Provider; id is the Job's name. For a failed Job
// the exit code is read from its pod, where Kubernetes keeps it.
func (p *Provider) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if len(id) > 63 || !dnsLabel.MatchString(id) {
		return sandbox.Sandbox{}, fmt.Errorf("kubernetes: get job %q: %w", id, sandbox.ErrNotFound)
	}
	job, err := p.api.BatchV1().Jobs(p.cfg.Namespace).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		return sandbox.Sandbox{}, mapErr("get job "+id, err)
	}
	sb := fromJob(job)
	if sb.State == sandbox.StateExited && sb.ExitCode == nil {
		sb.ExitCode = p.podExitCode(ctx, id)
	}
	return sb, nil
}

// podExitCode returns the runner container's exit code from the Job's
// pod, or nil when there is none (the deadline killed it before it ran,
// or the TTL controller removed it).
func (p *Provider) podExitCode(ctx context.Context, job string) *int {
	pods, err := p.api.CoreV1().Pods(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labelJobName + "=" + job})
	if err != nil {
		p.log.WarnContext(ctx, "could not list the job's pods", "job", job, "error", err)
		return nil
	}
	for _, pod := range pods.Items {
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == ContainerName && cs.State.Terminated != nil {
				return ptr(int(cs.State.Terminated.ExitCode))
			}
		}
	}
	return nil
}

// List implements sandbox.Provider with a label selector (always
// including LabelManagedBy), then re-checks the original label values.
func (p *Provider) List(ctx context.Context, labels map[string]string) ([]sandbox.Sandbox, error) {
	want := map[string]string{sandbox.LabelManagedBy: sandbox.ManagedByValue}
	maps.Copy(want, labels)
	sel := labelValues(want)
	terms := make([]string, 0, len(sel))
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		terms = append(terms, k+"="+sel[k])
	}
	jobs, err := p.api.BatchV1().Jobs(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: strings.Join(terms, ",")})
	if err != nil {
		return nil, mapErr("list jobs", err)
	}
	out := make([]sandbox.Sandbox, 0, len(jobs.Items))
	for i := range jobs.Items {
		sb := fromJob(&jobs.Items[i])
		if hasLabels(sb.Labels, want) {
			out = append(out, sb)
		}
	}
	return out, nil
}

// Destroy implements sandbox.Provider: deletes the Job with background
// propagation (without it the API server orphans the pod) and its Secret.
// Missing objects are success.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	if len(id) > 63 || !dnsLabel.MatchString(id) {
		return nil // cannot name a Job, so there is none to delete
	}
	bg := metav1.DeletePropagationBackground
	err := p.api.BatchV1().Jobs(p.cfg.Namespace).Delete(ctx, id, metav1.DeleteOptions{PropagationPolicy: &bg})
	if err != nil && !apierrors.IsNotFound(err) {
		return mapErr("delete job "+id, err)
	}
	err = p.api.CoreV1().Secrets(p.cfg.Namespace).Delete(ctx, id, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return mapErr("delete secret "+id, err)
	}
	return nil
}

func (p *Provider) deleteSecret(ctx context.Context, name string) {
	err := p.api.CoreV1().Secrets(p.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		p.log.WarnContext(ctx, "could not delete secret", "secret", name, "error", err)
	}
}

func fromJob(job *batchv1.Job) sandbox.Sandbox {
	sb := sandbox.Sandbox{
		ID: job.Name, Provider: ProviderName, State: sandbox.StatePending,
		Labels:    job.Labels,
		CreatedAt: job.CreationTimestamp.UTC(),
	}
	if raw, ok := job.Annotations[AnnotationLabels]; ok {
		var original map[string]string
		if json.Unmarshal([]byte(raw), &original) == nil {
			sb.Labels = original
		}
	}
	switch {
	case job.DeletionTimestamp != nil:
		sb.State = sandbox.StateGone
	case hasCondition(job, batchv1.JobComplete):
		sb.State = sandbox.StateExited
		sb.ExitCode = ptr(0)
	case hasCondition(job, batchv1.JobFailed):
		// The exit code lives on the pod; a failed Job only says why
		// (BackoffLimitExceeded, DeadlineExceeded…).
		sb.State = sandbox.StateExited
	case job.Status.Active > 0 && (job.Status.Ready == nil || *job.Status.Ready > 0):
		sb.State = sandbox.StateRunning
	}
	return sb
}

func hasCondition(job *batchv1.Job, t batchv1.JobConditionType) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

var labelUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// labelValues makes every value a valid label value: at most 63
// characters of [A-Za-z0-9_.-], starting and ending with a letter or
// digit. Task ids, owners and "taskrunner" are usually already valid.
func labelValues(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		v = labelUnsafe.ReplaceAllString(v, "_")
		if len(v) > 63 {
			v = v[:63]
		}
		out[k] = strings.TrimFunc(v, func(r rune) bool { return r == '_' || r == '.' || r == '-' })
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// mapErr wraps an API error with the sandbox error it stands for, so
// errors.Is works on both.
func mapErr(op string, err error) error {
	var kind error
	switch {
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		kind = sandbox.ErrCapacity
	case apierrors.IsUnauthorized(err), apierrors.IsForbidden(err):
		kind = sandbox.ErrUnauthorized
	case apierrors.IsNotFound(err):
		kind = sandbox.ErrNotFound
	case apierrors.IsBadRequest(err), apierrors.IsInvalid(err):
		kind = sandbox.ErrInvalidSpec
	case apierrors.IsTooManyRequests(err):
		// client-go has already waited out Retry-After and retried.
		kind = sandbox.ErrCapacity
	default:
		return fmt.Errorf("kubernetes: %s: %w", op, err)
	}
	return fmt.Errorf("kubernetes: %s: %w: %w", op, kind, err)
}
