package deploytest

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/sandbox/docker"
)

var composeFile = filepath.Join(deployDir, "compose", "compose.yaml")

// ourImage matches the images this repository builds.
var ourImage = regexp.MustCompile(`^ghcr\.io/taskrunner/`)

// loadCompose loads the Compose file the way `docker compose` does, with every profile
// active. interpolate=false keeps ${…} references as written (for the no-secrets check).
func loadCompose(t *testing.T, interpolate bool) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{composeFile},
		cli.WithWorkingDirectory(filepath.Dir(composeFile)),
		cli.WithName("taskrunner"),
		cli.WithProfiles([]string{"*"}),
		cli.WithInterpolation(interpolate),
		cli.WithDiscardEnvFile,
		// Values for the variables the file requires with ${NAME:?…}; nothing else is set, so
		// every other default comes from the file itself.
		cli.WithEnv([]string{"POSTGRES_PASSWORD=not-a-secret"}),
	)
	require.NoError(t, err)
	p, err := opts.LoadProject(context.Background())
	require.NoError(t, err)
	return p
}

type composeInfo struct {
	ourEnv       map[string][]string // file label → variable names of our images' services
	interpolated []string            // names used as ${NAME…}
	dispatchEnv  map[string]string   // dispatch's interpolated environment
}

func composeFacts(t *testing.T) composeInfo {
	t.Helper()
	p := loadCompose(t, true)
	info := composeInfo{ourEnv: map[string][]string{}, dispatchEnv: map[string]string{}}
	for name, s := range p.AllServices() {
		for k := range s.Environment {
			if ourImage.MatchString(s.Image) {
				info.ourEnv["deploy/compose/compose.yaml services."+name] = append(info.ourEnv["deploy/compose/compose.yaml services."+name], k)
			}
		}
		if name == "dispatch" {
			for k, v := range s.Environment {
				if v != nil {
					info.dispatchEnv[k] = *v
				}
			}
		}
	}
	raw, err := os.ReadFile(composeFile)
	require.NoError(t, err)
	// Comments may show the syntax (${NAME}); only YAML values count.
	for _, m := range regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)`).FindAllStringSubmatch(stripComments(string(raw)), -1) {
		if !slices.Contains(info.interpolated, m[1]) {
			info.interpolated = append(info.interpolated, m[1])
		}
	}
	return info
}

func TestComposeServicesAreHealthCheckedOrOneShot(t *testing.T) {
	p := loadCompose(t, true)
	all := p.AllServices()
	require.Subset(t, keys(all), []string{"postgres", "redis", "jaeger", "pki-init", "migrate",
		"task", "dispatch", "githubtoken", "events", "gateway", "taskctl"})
	oneShot := func(s types.ServiceConfig) bool { return s.Restart == types.RestartPolicyNo }
	for name, s := range all {
		hc := s.HealthCheck != nil && !s.HealthCheck.Disable && len(s.HealthCheck.Test) > 1
		switch {
		case hc:
			require.False(t, oneShot(s), "%s: a healthchecked service should be long-running", name)
		case oneShot(s):
			// A one-shot must be awaited with service_completed_successfully by whoever needs it;
			// see TestComposeDependenciesWaitForHealth.
		default:
			require.Fail(t, "service has neither a healthcheck nor restart: \"no\"", name)
		}
	}
	// The gRPC services are probed through gRPC health v1, the gateway through /readyz.
	for _, name := range []string{"task", "dispatch", "githubtoken", "events"} {
		require.Contains(t, strings.Join(all[name].HealthCheck.Test, " "), "grpc_health_probe -addr=127.0.0.1:7070", name)
	}
	require.Contains(t, strings.Join(all["gateway"].HealthCheck.Test, " "), "/readyz")
}

func TestComposeDependenciesWaitForHealth(t *testing.T) {
	p := loadCompose(t, true)
	all := p.AllServices()
	usedOneShots := map[string]bool{}
	for name, s := range all {
		for dep, d := range s.DependsOn {
			target, ok := all[dep]
			require.True(t, ok, "%s depends on unknown %s", name, dep)
			if target.Restart == types.RestartPolicyNo {
				require.Equal(t, types.ServiceConditionCompletedSuccessfully, d.Condition, "%s → %s (one-shot)", name, dep)
				usedOneShots[dep] = true
			} else {
				require.Equal(t, types.ServiceConditionHealthy, d.Condition, "%s → %s", name, dep)
			}
		}
	}
	// Every one-shot except the CLI is awaited by something.
	for name, s := range all {
		if s.Restart == types.RestartPolicyNo && name != "taskctl" {
			require.True(t, usedOneShots[name], "one-shot %s is awaited by no service", name)
		}
	}
	// The services need a migrated schema; the runner-port services the PKI.
	for _, name := range []string{"task", "dispatch", "githubtoken", "events"} {
		require.Contains(t, all[name].DependsOn, "migrate", name)
	}
	for _, name := range []string{"dispatch", "githubtoken", "events"} {
		require.Contains(t, all[name].DependsOn, "pki-init", name)
	}
}

func TestComposeImagesArePinned(t *testing.T) {
	p := loadCompose(t, true)
	for name, s := range p.AllServices() {
		require.NotEmpty(t, s.Image, name)
		requirePinned(t, s.Image, "compose service "+name)
	}
	// The runner image dispatch starts is pinned too.
	env := p.AllServices()["dispatch"].Environment
	requirePinned(t, *env["TASKRUNNER_DOCKER_IMAGE"], "TASKRUNNER_DOCKER_IMAGE")
	requirePinned(t, *env["TASKRUNNER_RUNNER_IMAGE"], "TASKRUNNER_RUNNER_IMAGE")
}

// secretName matches variables that hold credentials.
var secretName = regexp.MustCompile(`(PASSWORD|SECRET|_TOKEN$|_KEY$)`)

// credentialURL finds a password in a URL (scheme://user:password@host).
var credentialURL = regexp.MustCompile(`://[^/:@\s]*:([^@]+)@`)

func TestComposeHasNoInlineSecrets(t *testing.T) {
	p := loadCompose(t, false) // values as written, ${…} not expanded
	checked := 0
	for name, s := range p.AllServices() {
		for k, v := range s.Environment {
			if v == nil {
				continue
			}
			if secretName.MatchString(k) && !strings.HasSuffix(k, "_FILE") {
				require.Regexp(t, `^\$\{[A-Z0-9_]+(:?[-?][^}]*)?\}$`, *v, "%s: %s must come from .env", name, k)
				require.NotRegexp(t, `:-[^}]`, *v, "%s: %s must not have an inline default", name, k)
				checked++
			}
			if m := credentialURL.FindStringSubmatch(*v); m != nil {
				require.Regexp(t, `^\$\{[A-Z0-9_]+[^}]*\}$`, m[1], "%s: %s carries an inline password", name, k)
				checked++
			}
		}
		for _, sec := range s.Secrets {
			def, ok := p.Secrets[sec.Source]
			require.True(t, ok, "%s: unknown secret %s", name, sec.Source)
			require.NotEmpty(t, def.File, "%s: secret %s must come from a file", name, sec.Source)
			require.Empty(t, def.Content, "%s: secret %s has inline content", name, sec.Source)
		}
	}
	require.GreaterOrEqual(t, checked, 8, "too few secret variables found to be checking anything")
	// And the file is not hiding a value in a comment or an x- block.
	raw, err := os.ReadFile(composeFile)
	require.NoError(t, err)
	require.NotRegexp(t, `(sk-ant-|sk-[A-Za-z0-9]{20}|ghp_|github_pat_|trt_[A-Za-z0-9]|BEGIN [A-Z ]*PRIVATE KEY)`, string(raw))
}

func TestComposeEnvExampleListsEveryVariable(t *testing.T) {
	keys := envFileKeys(t, filepath.Join(deployDir, "compose", ".env.example"))
	for _, n := range composeFacts(t).interpolated {
		require.Contains(t, keys, n, "compose.yaml interpolates %s: list it in .env.example", n)
	}
	// And .env.example carries no real secret.
	raw, err := os.ReadFile(filepath.Join(deployDir, "compose", ".env.example"))
	require.NoError(t, err)
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if ok && !strings.HasPrefix(k, "#") && secretName.MatchString(k) && !strings.HasSuffix(k, "_FILE") {
			require.Empty(t, v, ".env.example: %s must be empty", k)
		}
	}
}

func TestComposeDockerProvider(t *testing.T) {
	p := loadCompose(t, true)
	all := p.AllServices()
	d := all["dispatch"]
	require.Equal(t, "docker", *d.Environment["TASKRUNNER_SANDBOX_PROVIDER"])
	for _, v := range d.Volumes {
		require.NotEqual(t, "/var/run/docker.sock", v.Target, "dispatch reaches Docker through the socket proxy only")
		require.NotContains(t, v.Source, "docker.sock")
	}
	require.Equal(t, "tcp://docker-socket-proxy:2375", *d.Environment["TASKRUNNER_DOCKER_HOST"])
	// Sandboxes join the runners network, which Events and GitHubToken are on and
	// PostgreSQL/Redis are not.
	netName := *d.Environment["TASKRUNNER_DOCKER_NETWORK"]
	var runnersKey string
	for k, n := range p.Networks {
		if n.Name == netName {
			runnersKey = k
		}
	}
	require.NotEmpty(t, runnersKey, "TASKRUNNER_DOCKER_NETWORK %q is no network of the project", netName)
	for _, name := range []string{"events", "githubtoken"} {
		require.Contains(t, all[name].Networks, runnersKey, name)
	}
	for _, name := range []string{"postgres", "redis", "dispatch", "task"} {
		require.NotContains(t, all[name].Networks, runnersKey, "%s must not be reachable from sandboxes", name)
	}
	// The addresses runners dial resolve on that network and match the runner port default.
	k := knownVars(t)
	port := k.defaultPort(t, "TASKRUNNER_RUNNER_GRPC_ADDR")
	require.Equal(t, "events:"+itoa(port), *d.Environment["TASKRUNNER_RUNNER_EVENTS_ADDR"])
	require.Equal(t, "githubtoken:"+itoa(port), *d.Environment["TASKRUNNER_RUNNER_TOKEN_ADDR"])
	// The server certificate names what runners verify.
	require.Contains(t, strings.Join(all["pki-init"].Command, " "), "--hosts=events,githubtoken")
	require.Equal(t, "events", *d.Environment["TASKRUNNER_RUNNER_SERVER_NAME"])
}

func keys[M ~map[string]V, V any](m M) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// socketProxyRules reads the per-method allowlist (Go regexps) of the
// docker-socket-proxy service from its command line.
func socketProxyRules(t *testing.T, s types.ServiceConfig) map[string][]*regexp.Regexp {
	t.Helper()
	rules := map[string][]*regexp.Regexp{}
	for _, arg := range s.Command {
		flag, val, ok := strings.Cut(strings.TrimPrefix(arg, "-"), "=")
		method, isAllow := strings.CutPrefix(flag, "allow")
		if !ok || !isAllow || method == "from" || method == "bindmountfrom" {
			continue
		}
		require.Equal(t, strings.ToUpper(method), method, "unknown flag %s", arg)
		// The proxy matches the whole path; anchor as it does.
		rules[method] = append(rules[method], regexp.MustCompile("^(?:"+val+")$"))
	}
	return rules
}

func allowed(rules map[string][]*regexp.Regexp, method, path string) bool {
	for _, re := range rules[method] {
		if re.MatchString(path) {
			return true
		}
	}
	return false
}

func TestComposeDockerSocketProxy(t *testing.T) {
	p := loadCompose(t, true)
	all := p.AllServices()
	proxy, ok := all["docker-socket-proxy"]
	require.True(t, ok, "a docker-socket-proxy service")

	// Only the proxy holds the socket, read-only, and only dispatch reaches it.
	var sock bool
	for _, v := range proxy.Volumes {
		if v.Target == "/var/run/docker.sock" {
			sock = true
			require.True(t, v.ReadOnly)
		}
	}
	require.True(t, sock, "the proxy mounts the Docker socket")
	for name, s := range all {
		if name == "docker-socket-proxy" {
			continue
		}
		for _, v := range s.Volumes {
			require.NotContains(t, v.Source, "docker.sock", "%s must not mount the Docker socket", name)
		}
	}
	require.Len(t, proxy.Networks, 1)
	var apiNet string
	for k := range proxy.Networks {
		apiNet = k
	}
	require.True(t, p.Networks[apiNet].Internal, "the Docker API network has no route out")
	for name, s := range all {
		if _, on := s.Networks[apiNet]; on {
			require.Contains(t, []string{"dispatch", "docker-socket-proxy"}, name, "%s must not reach the Docker API", name)
		}
	}
	require.Contains(t, proxy.Command, "-allowfrom=dispatch")
	require.True(t, proxy.ReadOnly)
	require.Equal(t, types.StringList{"ALL"}, types.StringList(proxy.CapDrop))
	require.Regexp(t, `^wollomatic/socket-proxy:\d+\.\d+\.\d+$`, proxy.Image, "pinned")

	rules := socketProxyRules(t, proxy)
	require.ElementsMatch(t, []string{"HEAD", "GET", "POST", "DELETE"}, keys(rules), "no PUT, PATCH or other method")
	ids := []string{"taskrunner-0b7c6f3e-1d2a-4c5b-9e8f-123456789abc", strings.Repeat("ab12", 16)}
	for _, ep := range docker.Endpoints {
		for _, v := range []string{"v1.40", "v1.47", "v1.57"} {
			for _, id := range ids {
				path := ep.Sample(v, id)
				require.True(t, allowed(rules, ep.Method, path), "the docker provider calls %s %s", ep.Method, path)
			}
		}
	}
	for _, call := range []string{
		"POST /v1.47/containers/x/exec", "POST /v1.47/exec/x/start", "GET /v1.47/containers/x/archive",
		"PUT /v1.47/containers/x/archive", "POST /v1.47/containers/x/update", "POST /v1.47/containers/x/attach",
		"GET /v1.47/containers/x/export", "POST /v1.47/build", "POST /v1.47/volumes/create", "GET /v1.47/volumes",
		"POST /v1.47/networks/create", "POST /v1.47/networks/x/connect", "GET /v1.47/secrets", "POST /v1.47/swarm/init",
		"GET /v1.47/info", "POST /v1.47/images/load", "DELETE /v1.47/images/x", "POST /v1.47/plugins/pull",
		"POST /v1.47/containers/create/../../build", "GET /v1.47/containers/x/json/../../../secrets",
		"DELETE /v1.47/containers/x/../../volumes/y", "POST /v1.47/auth", "POST /v1.47/session",
	} {
		method, path, _ := strings.Cut(call, " ")
		require.False(t, allowed(rules, method, path), "%s must be refused", call)
	}
}
