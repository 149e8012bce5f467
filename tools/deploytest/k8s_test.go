package deploytest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

var k8sDir = filepath.Join(deployDir, "k8s")

// k8sTypes maps apiVersion/kind to the k8s.io/api type a manifest is decoded into.
var k8sTypes = map[string]func() any{
	"v1/Namespace":                      func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                      func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                         func() any { return &corev1.Secret{} },
	"v1/Service":                        func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                 func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                      func() any { return &batchv1.Job{} },
	"rbac.authorization.k8s.io/v1/Role": func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":        func() any { return &rbacv1.RoleBinding{} },
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"networking.k8s.io/v1/NetworkPolicy":              func() any { return &networkingv1.NetworkPolicy{} },
	"node.k8s.io/v1/RuntimeClass":                     func() any { return &nodev1.RuntimeClass{} },
}

type k8sObject struct {
	file string
	obj  any
}

// strictDecode converts YAML to JSON and decodes it into out, failing on unknown fields (a
// misspelt or misplaced key would otherwise be dropped silently by the API server).
func strictDecode(doc []byte, out any) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	return dec.Decode(out)
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// k8sObjects strictly decodes every manifest listed in the kustomization.
func k8sObjects(t *testing.T) []k8sObject {
	t.Helper()
	var out []k8sObject
	for _, file := range kustomization(t).Resources {
		raw, err := os.ReadFile(filepath.Join(k8sDir, file))
		require.NoError(t, err)
		for i, doc := range docSep.Split(string(raw), -1) {
			var tm metav1.TypeMeta
			require.NoError(t, yaml.Unmarshal([]byte(doc), &tm), "%s doc %d", file, i)
			if tm.Kind == "" && strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			mk, ok := k8sTypes[tm.APIVersion+"/"+tm.Kind]
			require.True(t, ok, "%s doc %d: unexpected %s/%s", file, i, tm.APIVersion, tm.Kind)
			obj := mk()
			require.NoError(t, strictDecode([]byte(doc), obj), "%s doc %d (%s)", file, i, tm.Kind)
			out = append(out, k8sObject{file: file, obj: obj})
		}
	}
	require.NotEmpty(t, out)
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// kustomizationFile is the part of kustomize's Kustomization this directory uses. Decoded
// strictly as well, so an unsupported key fails here instead of being ignored.
type kustomizationFile struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewTag  string `json:"newTag,omitempty"`
		NewName string `json:"newName,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images"`
	SecretGenerator []struct {
		Name      string   `json:"name"`
		Namespace string   `json:"namespace"`
		Envs      []string `json:"envs,omitempty"`
		Files     []string `json:"files,omitempty"`
	} `json:"secretGenerator"`
}

func kustomization(t *testing.T) kustomizationFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(k8sDir, "kustomization.yaml"))
	require.NoError(t, err)
	var k kustomizationFile
	require.NoError(t, strictDecode(raw, &k))
	require.Equal(t, "Kustomization", k.Kind)
	return k
}

func TestKustomizationListsEveryFile(t *testing.T) {
	k := kustomization(t)
	manifests, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	require.NoError(t, err)
	var files []string
	for _, m := range manifests {
		if b := filepath.Base(m); b != "kustomization.yaml" {
			files = append(files, b)
		}
	}
	sort.Strings(files)
	listed := slices.Clone(k.Resources)
	sort.Strings(listed)
	require.Equal(t, files, listed, "every manifest in deploy/k8s is a resource, and every resource exists")
	// Generator inputs are the operator's (secrets, certificates): absent from git, but each
	// has an example or a documented command.
	for _, g := range k.SecretGenerator {
		require.Equal(t, "taskrunner", g.Namespace, g.Name)
		for _, e := range g.Envs {
			_, err := os.Stat(filepath.Join(k8sDir, e+".example"))
			require.NoError(t, err, "%s: %s needs %s.example", g.Name, e, e)
		}
		for _, f := range g.Files {
			_, src, ok := strings.Cut(f, "=")
			if !ok {
				src = f
			}
			dir := filepath.Dir(src)
			_, err := os.Stat(filepath.Join(k8sDir, dir, ".gitignore"))
			require.NoError(t, err, "%s: %s must be git-ignored", g.Name, dir)
		}
	}
}

// deployments returns the Deployments by name.
func deployments(t *testing.T) map[string]*appsv1.Deployment {
	out := map[string]*appsv1.Deployment{}
	for _, o := range k8sObjects(t) {
		if d, ok := o.obj.(*appsv1.Deployment); ok {
			out[d.Name] = d
		}
	}
	return out
}

func TestK8sDeploymentsHaveProbes(t *testing.T) {
	k := knownVars(t)
	grpcPort := int32(k.defaultPort(t, "TASKRUNNER_GRPC_ADDR"))
	httpPort := int32(k.defaultPort(t, "TASKRUNNER_HTTP_ADDR"))
	deps := deployments(t)
	require.Subset(t, keys(deps), []string{"taskrunner-task", "taskrunner-dispatch", "taskrunner-githubtoken",
		"taskrunner-events", "taskrunner-gateway"})
	for name, d := range deps {
		require.Equal(t, d.Spec.Selector.MatchLabels, pick(d.Spec.Template.Labels, keys(d.Spec.Selector.MatchLabels)), name)
		for _, c := range d.Spec.Template.Spec.Containers {
			require.NotNil(t, c.ReadinessProbe, "%s/%s: readiness probe", name, c.Name)
			require.NotNil(t, c.LivenessProbe, "%s/%s: liveness probe", name, c.Name)
			requirePinned(t, c.Image, name)
			sc := c.SecurityContext
			require.NotNil(t, sc, name)
			require.False(t, *sc.AllowPrivilegeEscalation, name)
			require.True(t, *sc.ReadOnlyRootFilesystem, name)
			require.True(t, *d.Spec.Template.Spec.SecurityContext.RunAsNonRoot, name)
			if name == "taskrunner-gateway" {
				require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
				require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
				require.Equal(t, httpPort, containerPort(t, c, c.ReadinessProbe.HTTPGet.Port))
				continue
			}
			require.NotNil(t, c.ReadinessProbe.GRPC, "%s: gRPC health readiness", name)
			require.Equal(t, grpcPort, c.ReadinessProbe.GRPC.Port, name)
			require.NotNil(t, c.StartupProbe, name)
			require.Equal(t, grpcPort, c.StartupProbe.GRPC.Port, name)
			svc := strings.TrimPrefix(name, "taskrunner-")
			require.Equal(t, []string{"taskrunnerd", "--services=" + svc}, c.Args, name)
		}
	}
}

func containerPort(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	require.Fail(t, "no container port named "+p.StrVal)
	return 0
}

func pick(m map[string]string, ks []string) map[string]string {
	out := map[string]string{}
	for _, k := range ks {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out
}

// k8sDispatchEnv is the dispatch container's literal environment (ConfigMap included).
func k8sDispatchEnv(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	var cm *corev1.ConfigMap
	for _, o := range k8sObjects(t) {
		if c, ok := o.obj.(*corev1.ConfigMap); ok && c.Name == "taskrunner-config" {
			cm = c
		}
	}
	require.NotNil(t, cm)
	d := deployments(t)["taskrunner-dispatch"]
	require.NotNil(t, d)
	c := d.Spec.Template.Spec.Containers[0]
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil && ef.ConfigMapRef.Name == cm.Name {
			for k, v := range cm.Data {
				out[k] = v
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			out[e.Name] = "(secret " + e.ValueFrom.SecretKeyRef.Key + ")"
		case e.Value != "":
			out[e.Name] = e.Value
		}
	}
	return out
}

func runnerNamespace(t *testing.T) string {
	ns := k8sDispatchEnv(t)["TASKRUNNER_K8S_NAMESPACE"]
	require.NotEmpty(t, ns)
	return ns
}

func TestK8sRBACStaysInTheRunnerNamespace(t *testing.T) {
	ns := runnerNamespace(t)
	dispatch := deployments(t)["taskrunner-dispatch"].Spec.Template.Spec.ServiceAccountName
	var roles, bindings int
	for _, o := range k8sObjects(t) {
		switch r := o.obj.(type) {
		case *rbacv1.ClusterRole:
			for _, rule := range r.Rules {
				for _, res := range rule.Resources {
					require.NotContains(t, []string{"jobs", "pods", "secrets", "*"}, res, "ClusterRole %s grants %s cluster-wide", r.Name, res)
				}
			}
		case *rbacv1.ClusterRoleBinding:
			require.Fail(t, "no ClusterRoleBinding: every grant is namespaced", r.Name)
		case *rbacv1.Role:
			require.Equal(t, ns, r.Namespace, "Role %s", r.Name)
			roles++
			for _, rule := range r.Rules {
				require.NotContains(t, rule.Verbs, "*", r.Name)
				require.NotContains(t, rule.Resources, "*", r.Name)
				for _, res := range rule.Resources {
					require.Contains(t, []string{"jobs", "pods", "secrets"}, res, r.Name)
				}
			}
		case *rbacv1.RoleBinding:
			require.Equal(t, ns, r.Namespace, "RoleBinding %s", r.Name)
			require.Equal(t, "Role", r.RoleRef.Kind, "RoleBinding %s must bind a Role, not a ClusterRole", r.Name)
			bindings++
			require.Len(t, r.Subjects, 1)
			require.Equal(t, dispatch, r.Subjects[0].Name)
		}
	}
	require.Equal(t, 1, roles)
	require.Equal(t, 1, bindings)
	// Nobody else gets API access: every other pod has no service-account token.
	for name, d := range deployments(t) {
		if name != "taskrunner-dispatch" {
			require.False(t, *d.Spec.Template.Spec.AutomountServiceAccountToken, name)
		}
	}
}

func TestK8sNetworkPolicyConfinesRunners(t *testing.T) {
	ns := runnerNamespace(t)
	denv := k8sDispatchEnv(t)
	runnerPort := int32(knownVars(t).defaultPort(t, "TASKRUNNER_RUNNER_GRPC_ADDR"))
	var runner *networkingv1.NetworkPolicy
	for _, o := range k8sObjects(t) {
		if p, ok := o.obj.(*networkingv1.NetworkPolicy); ok && p.Namespace == ns && p.Spec.PodSelector.MatchLabels["taskrunner.managed-by"] == "taskrunner" {
			runner = p
		}
	}
	require.NotNil(t, runner, "a NetworkPolicy selecting runner pods (label taskrunner.managed-by)")
	require.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, runner.Spec.PolicyTypes)
	require.Empty(t, runner.Spec.Ingress, "runner pods accept no connections")
	var dns, control, internet bool
	for _, e := range runner.Spec.Egress {
		require.NotEmpty(t, e.Ports, "every egress rule names its ports")
		require.NotEmpty(t, e.To, "every egress rule names its peers")
		for _, to := range e.To {
			switch {
			case to.IPBlock != nil:
				require.Equal(t, int32(443), e.Ports[0].Port.IntVal, "internet egress is HTTPS only")
				if to.IPBlock.CIDR == "0.0.0.0/0" {
					require.Subset(t, to.IPBlock.Except, []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"})
				}
				internet = true
			case to.PodSelector != nil && to.PodSelector.MatchLabels["k8s-app"] == "kube-dns":
				dns = true
			case to.NamespaceSelector != nil && to.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "taskrunner":
				require.Len(t, e.Ports, 1)
				require.Equal(t, runnerPort, e.Ports[0].Port.IntVal)
				require.Len(t, to.PodSelector.MatchExpressions, 1)
				require.ElementsMatch(t, []string{"taskrunner-events", "taskrunner-githubtoken"}, to.PodSelector.MatchExpressions[0].Values)
				control = true
			default:
				require.Fail(t, "unexpected egress peer")
			}
		}
	}
	require.True(t, dns && control && internet, "DNS, Events/GitHubToken, model API/GitHub")
	// The addresses runners are given are the Services the policy allows.
	for _, k := range []string{"TASKRUNNER_RUNNER_EVENTS_ADDR", "TASKRUNNER_RUNNER_TOKEN_ADDR"} {
		require.Regexp(t, `^taskrunner-(events|githubtoken)\.taskrunner\.svc\.cluster\.local:`+itoa(int(runnerPort))+`$`, denv[k])
	}
	// The runner pods' identity has no token and no binding.
	require.Equal(t, "taskrunner-runner", denv["TASKRUNNER_K8S_SERVICE_ACCOUNT"])
	for _, o := range k8sObjects(t) {
		if sa, ok := o.obj.(*corev1.ServiceAccount); ok && sa.Name == "taskrunner-runner" {
			require.Equal(t, ns, sa.Namespace)
			require.False(t, *sa.AutomountServiceAccountToken)
		}
	}
}

func TestK8sManifestsHoldNoSecretValues(t *testing.T) {
	var secretRefs int
	for _, o := range k8sObjects(t) {
		switch v := o.obj.(type) {
		case *corev1.Secret:
			require.Fail(t, "Secrets come from secretGenerator inputs that are not in git", v.Name)
		case *corev1.ConfigMap:
			for k := range v.Data {
				require.NotRegexp(t, secretName, k, "ConfigMap %s: %s belongs in the Secret", v.Name, k)
			}
		case *appsv1.Deployment:
			for _, c := range v.Spec.Template.Spec.Containers {
				for _, e := range c.Env {
					if secretName.MatchString(e.Name) && !strings.HasSuffix(e.Name, "_FILE") {
						require.Empty(t, e.Value, "%s: %s inline", v.Name, e.Name)
						require.NotNil(t, e.ValueFrom.SecretKeyRef, "%s: %s", v.Name, e.Name)
						secretRefs++
					}
					if strings.HasSuffix(e.Name, "_URL") && e.Value != "" {
						require.NotRegexp(t, credentialURL, e.Value, "%s: %s has a password", v.Name, e.Name)
					}
				}
			}
		}
	}
	require.GreaterOrEqual(t, secretRefs, 5)
}

func TestK8sRuntimeClassExample(t *testing.T) {
	var rc *nodev1.RuntimeClass
	for _, o := range k8sObjects(t) {
		if r, ok := o.obj.(*nodev1.RuntimeClass); ok {
			rc = r
		}
	}
	require.NotNil(t, rc)
	require.Contains(t, rc.Handler, "kata")
	// The dispatch file names it where the operator switches it on.
	raw, err := os.ReadFile(filepath.Join(k8sDir, "dispatch.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(raw), "TASKRUNNER_K8S_RUNTIME_CLASS")
	require.Contains(t, string(raw), rc.Name)
}

// k8sEnvMentions lists every variable name the manifests use.
func k8sEnvMentions(t *testing.T) []mention {
	t.Helper()
	var out []mention
	for _, o := range k8sObjects(t) {
		file := "deploy/k8s/" + o.file
		var pods []corev1.PodSpec
		switch v := o.obj.(type) {
		case *corev1.ConfigMap:
			for k := range v.Data {
				out = append(out, mention{file, k})
			}
		case *corev1.Secret:
			for k := range v.Data {
				out = append(out, mention{file, k})
			}
			for k := range v.StringData {
				out = append(out, mention{file, k})
			}
		case *appsv1.Deployment:
			pods = append(pods, v.Spec.Template.Spec)
		case *batchv1.Job:
			pods = append(pods, v.Spec.Template.Spec)
		}
		for _, p := range pods {
			for _, c := range slices.Concat(p.InitContainers, p.Containers) {
				for _, e := range c.Env {
					out = append(out, mention{file, e.Name})
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
						out = append(out, mention{file + " secretKeyRef", e.ValueFrom.SecretKeyRef.Key})
					}
					if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
						out = append(out, mention{file + " configMapKeyRef", e.ValueFrom.ConfigMapKeyRef.Key})
					}
				}
			}
		}
	}
	// Commented-out settings count too (dispatch.yaml's RuntimeClass switch).
	for _, file := range kustomization(t).Resources {
		raw, err := os.ReadFile(filepath.Join(k8sDir, file))
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`#\s*-\s*name:\s*([A-Z][A-Z0-9_]+)`).FindAllStringSubmatch(string(raw), -1) {
			out = append(out, mention{"deploy/k8s/" + file + " (comment)", m[1]})
		}
	}
	return out
}
