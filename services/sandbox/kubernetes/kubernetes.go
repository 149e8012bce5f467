package kubernetes

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// In-cluster service-account files.
const (
	inClusterTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	inClusterCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// Config configures the provider.
type Config struct {
	// APIServer is the API server URL (https://host:6443). Empty: the
	// in-cluster address from KUBERNETES_SERVICE_HOST / _PORT, with the
	// pod's service-account token and CA.
	APIServer string `env:"TASKRUNNER_K8S_API_SERVER"`
	// Token is a bearer token. TokenFile is read on every request instead
	// (projected tokens rotate). Neither: no Authorization header (e.g.
	// behind kubectl proxy), except in-cluster.
	Token     string `env:"TASKRUNNER_K8S_TOKEN"`
	TokenFile string `env:"TASKRUNNER_K8S_TOKEN_FILE"`
	// CAFile verifies the API server's certificate. Empty: system roots.
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
	cfg       Config
	base      *url.URL
	http      *http.Client
	transport *http.Transport
	log       *slog.Logger
	now       func() time.Time
}

var _ sandbox.Provider = (*Provider)(nil)

// New validates cfg, resolves the in-cluster defaults and loads the CA.
// It does not call the API server.
func New(cfg Config, logger *slog.Logger) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.APIServer == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, errors.New("kubernetes provider: APIServer is required when not running in a cluster (KUBERNETES_SERVICE_HOST/PORT are not set)")
		}
		cfg.APIServer = "https://" + net.JoinHostPort(host, port)
		if cfg.Token == "" && cfg.TokenFile == "" {
			cfg.TokenFile = inClusterTokenFile
		}
		if cfg.CAFile == "" {
			cfg.CAFile = inClusterCAFile
		}
	}
	if cfg.TTLSecondsAfterFinished == 0 {
		cfg.TTLSecondsAfterFinished = DefaultTTLSecondsAfterFinished
	}
	base, _ := url.Parse(strings.TrimRight(cfg.APIServer, "/"))

	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kubernetes provider: CAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kubernetes provider: CAFile %s holds no PEM certificate", cfg.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if cfg.TokenFile != "" {
		if _, err := os.Stat(cfg.TokenFile); err != nil {
			return nil, fmt.Errorf("kubernetes provider: TokenFile: %w", err)
		}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Provider{
		cfg: cfg, base: base, transport: tr,
		http: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		log:  logger.With("provider", ProviderName),
		now:  time.Now,
	}, nil
}

// Close releases idle connections.
func (p *Provider) Close() error {
	p.transport.CloseIdleConnections()
	return nil
}

// Name implements sandbox.Provider.
func (p *Provider) Name() string { return ProviderName }

func (p *Provider) jobsPath() string {
	return "/apis/batch/v1/namespaces/" + p.cfg.Namespace + "/jobs"
}

func (p *Provider) secretsPath() string {
	return "/api/v1/namespaces/" + p.cfg.Namespace + "/secrets"
}

// Create implements sandbox.Provider. The Job and its Secret are both
// named sandbox.Name(TaskID), which makes Create idempotent: an existing
// Job is returned as it is.
func (p *Provider) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.TaskID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("kubernetes: %w: empty task id", sandbox.ErrInvalidSpec)
	}
	name := sandbox.Name(spec.TaskID)
	var existing batchv1.Job
	err := p.do(ctx, http.MethodGet, p.jobsPath()+"/"+name, nil, nil, &existing)
	if err == nil {
		return p.existing(&existing, spec)
	}
	if !isStatus(err, http.StatusNotFound) {
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
	err = p.do(ctx, http.MethodPost, p.secretsPath(), nil, secret, nil)
	if isAlreadyExists(err) {
		err = p.do(ctx, http.MethodPut, p.secretsPath()+"/"+name, nil, secret, nil)
	}
	if err != nil {
		return sandbox.Sandbox{}, mapErr("create secret "+name, err)
	}

	var created batchv1.Job
	err = p.do(ctx, http.MethodPost, p.jobsPath(), nil, job, &created)
	switch {
	case err == nil:
		p.log.InfoContext(ctx, "job created", "task_id", spec.TaskID, "job", name, "namespace", p.cfg.Namespace)
	case isAlreadyExists(err):
		// A concurrent Create won; its Job reads the Secret we replaced,
		// which holds the same task's environment.
		if err := p.do(ctx, http.MethodGet, p.jobsPath()+"/"+name, nil, nil, &created); err != nil {
			return sandbox.Sandbox{}, mapErr("get job "+name, err)
		}
		return p.existing(&created, spec)
	default:
		p.deleteSecret(ctx, name)
		return sandbox.Sandbox{}, mapErr("create job "+name, err)
	}

	// Hand the Secret to the Job so the garbage collector deletes it with
	// the Job (TTL or Destroy). Destroy deletes it explicitly as well, so a
	// failure here only costs a leftover Secret until then.
	patch := map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{{
		APIVersion: "batch/v1", Kind: "Job", Name: name, UID: created.UID,
	}}}}
	if err := p.do(ctx, http.MethodPatch, p.secretsPath()+"/"+name, nil, patch, nil); err != nil {
		p.log.WarnContext(ctx, "could not make the job own its secret", "job", name, "error", err)
	}
	return fromJob(&created), nil
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

// Get implements sandbox.Provider; id is the Job's name.
func (p *Provider) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if len(id) > 63 || !dnsLabel.MatchString(id) {
		return sandbox.Sandbox{}, fmt.Errorf("kubernetes: get job %q: %w", id, sandbox.ErrNotFound)
	}
	var job batchv1.Job
	if err := p.do(ctx, http.MethodGet, p.jobsPath()+"/"+id, nil, nil, &job); err != nil {
		return sandbox.Sandbox{}, mapErr("get job "+id, err)
	}
	return fromJob(&job), nil
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
	var jobs batchv1.JobList
	q := url.Values{"labelSelector": {strings.Join(terms, ",")}}
	if err := p.do(ctx, http.MethodGet, p.jobsPath(), q, nil, &jobs); err != nil {
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
	q := url.Values{"propagationPolicy": {string(metav1.DeletePropagationBackground)}}
	err := p.do(ctx, http.MethodDelete, p.jobsPath()+"/"+id, q, nil, nil)
	if err != nil && !isStatus(err, http.StatusNotFound) {
		return mapErr("delete job "+id, err)
	}
	err = p.do(ctx, http.MethodDelete, p.secretsPath()+"/"+id, nil, nil, nil)
	if err != nil && !isStatus(err, http.StatusNotFound) {
		return mapErr("delete secret "+id, err)
	}
	return nil
}

func (p *Provider) deleteSecret(ctx context.Context, name string) {
	err := p.do(ctx, http.MethodDelete, p.secretsPath()+"/"+name, nil, nil, nil)
	if err != nil && !isStatus(err, http.StatusNotFound) {
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

// statusError is a non-2xx answer of the API server.
type statusError struct {
	Code    int
	Reason  metav1.StatusReason
	Message string
}

func (e *statusError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("HTTP %d %s: %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Code, e.Message)
}

func isStatus(err error, code int) bool {
	var se *statusError
	return errors.As(err, &se) && se.Code == code
}

func isAlreadyExists(err error) bool {
	var se *statusError
	return errors.As(err, &se) && se.Code == http.StatusConflict && se.Reason == metav1.StatusReasonAlreadyExists
}

func (p *Provider) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	u := *p.base
	u.Path += path
	u.RawQuery = q.Encode()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "taskrunner")
	if in != nil {
		ct := "application/json"
		if method == http.MethodPatch {
			ct = "application/merge-patch+json"
		}
		req.Header.Set("Content-Type", ct)
	}
	tok := p.cfg.Token
	if p.cfg.TokenFile != "" {
		b, err := os.ReadFile(p.cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("read TokenFile: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		se := &statusError{Code: resp.StatusCode, Message: strings.TrimSpace(string(raw))}
		var st metav1.Status
		if json.Unmarshal(raw, &st) == nil && st.Kind == "Status" {
			se.Reason, se.Message = st.Reason, st.Message
		}
		return se
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return nil
}

// mapErr wraps an API error with the sandbox error it stands for, so
// errors.Is works on both.
func mapErr(op string, err error) error {
	var se *statusError
	if !errors.As(err, &se) {
		return fmt.Errorf("kubernetes: %s: %w", op, err)
	}
	var kind error
	switch {
	case se.Code == http.StatusForbidden && strings.Contains(se.Message, "exceeded quota"):
		kind = sandbox.ErrCapacity
	case se.Code == http.StatusUnauthorized, se.Code == http.StatusForbidden:
		kind = sandbox.ErrUnauthorized
	case se.Code == http.StatusNotFound:
		kind = sandbox.ErrNotFound
	case se.Code == http.StatusBadRequest, se.Code == http.StatusUnprocessableEntity:
		kind = sandbox.ErrInvalidSpec
	default:
		return fmt.Errorf("kubernetes: %s: %w", op, err)
	}
	return fmt.Errorf("kubernetes: %s: %w: %w", op, kind, err)
}
