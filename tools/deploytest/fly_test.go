package deploytest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"github.com/stretchr/testify/require"
)

// flyConfig is the part of fly.toml these apps use, decoded strictly (an unknown or misspelt
// key fails, as `fly config validate` would).
type flyConfig struct {
	App           string `toml:"app"`
	PrimaryRegion string `toml:"primary_region"`
	Build         struct {
		Image string `toml:"image"`
	} `toml:"build"`
	Deploy struct {
		ReleaseCommand string `toml:"release_command"`
		Strategy       string `toml:"strategy"`
	} `toml:"deploy"`
	Processes map[string]string `toml:"processes"`
	Env       map[string]string `toml:"env"`
	Files     []struct {
		GuestPath  string   `toml:"guest_path"`
		SecretName string   `toml:"secret_name"`
		Processes  []string `toml:"processes"`
	} `toml:"files"`
	Services []struct {
		Processes          []string `toml:"processes"`
		InternalPort       int      `toml:"internal_port"`
		Protocol           string   `toml:"protocol"`
		AutoStopMachines   string   `toml:"auto_stop_machines"`
		MinMachinesRunning int      `toml:"min_machines_running"`
		Ports              []struct {
			Port       int      `toml:"port"`
			Handlers   []string `toml:"handlers"`
			ForceHTTPS bool     `toml:"force_https"`
		} `toml:"ports"`
		Concurrency struct {
			Type      string `toml:"type"`
			SoftLimit int    `toml:"soft_limit"`
			HardLimit int    `toml:"hard_limit"`
		} `toml:"concurrency"`
		HTTPChecks []struct {
			Interval    string `toml:"interval"`
			Timeout     string `toml:"timeout"`
			GracePeriod string `toml:"grace_period"`
			Method      string `toml:"method"`
			Path        string `toml:"path"`
		} `toml:"http_checks"`
	} `toml:"services"`
	Checks map[string]struct {
		Type        string   `toml:"type"`
		Port        int      `toml:"port"`
		Path        string   `toml:"path"`
		Interval    string   `toml:"interval"`
		Timeout     string   `toml:"timeout"`
		GracePeriod string   `toml:"grace_period"`
		Processes   []string `toml:"processes"`
	} `toml:"checks"`
	VM []struct {
		Size   string `toml:"size"`
		Memory string `toml:"memory"`
	} `toml:"vm"`

	path string
}

func (c flyConfig) fileSecrets() []string {
	var out []string
	for _, f := range c.Files {
		out = append(out, f.SecretName)
	}
	return out
}

// flyApps parses every fly.toml under deploy/fly.
func flyApps(t *testing.T) map[string]flyConfig {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(deployDir, "fly", "*", "fly.toml"))
	require.NoError(t, err)
	require.Len(t, paths, 3, "services, gateway and runner apps")
	out := map[string]flyConfig{}
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		var c flyConfig
		dec := toml.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&c), p)
		require.NotEmpty(t, c.App, p)
		requirePinned(t, c.Build.Image, p+" [build] image")
		c.path = p
		out[filepath.Base(filepath.Dir(p))] = c
	}
	return out
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, ok := strings.Cut(addr, ":")
	require.True(t, ok, addr)
	n := 0
	for _, r := range p {
		require.True(t, r >= '0' && r <= '9', addr)
		n = n*10 + int(r-'0')
	}
	return n
}

func TestFlyMatchesTheBinaries(t *testing.T) {
	k := knownVars(t)
	grpc := k.defaultPort(t, "TASKRUNNER_GRPC_ADDR")
	runnerPort := k.defaultPort(t, "TASKRUNNER_RUNNER_GRPC_ADDR")
	http := k.defaultPort(t, "TASKRUNNER_HTTP_ADDR")
	apps := flyApps(t)
	cp, gw, runner := apps["controlplane"], apps["gateway"], apps["runner"]

	// Services app: one process group per service, private only, ports as the binaries'.
	require.Equal(t, map[string]string{
		"task": "taskrunnerd --services=task", "dispatch": "taskrunnerd --services=dispatch",
		"githubtoken": "taskrunnerd --services=githubtoken", "events": "taskrunnerd --services=events",
	}, cp.Processes)
	require.Empty(t, cp.Services, "the gRPC services are private (6PN only)")
	require.Equal(t, grpc, portOf(t, cp.Env["TASKRUNNER_GRPC_ADDR"]))
	require.Equal(t, runnerPort, portOf(t, cp.Env["TASKRUNNER_RUNNER_GRPC_ADDR"]))
	require.Equal(t, "taskrunnerd migrate", cp.Deploy.ReleaseCommand)
	for name, c := range cp.Checks {
		require.Len(t, c.Processes, 1, name)
		require.Contains(t, []int{grpc, runnerPort}, c.Port, name)
	}
	for _, p := range []string{"task", "dispatch", "githubtoken", "events"} {
		require.Contains(t, cp.Checks, p)
	}
	// Addresses between apps use the process DNS names and the binaries' ports.
	require.Equal(t, "dispatch.process."+cp.App+".internal:"+itoa(grpc), cp.Env["TASKRUNNER_DISPATCH_ADDR"])
	require.Equal(t, "events.process."+cp.App+".internal:"+itoa(runnerPort), cp.Env["TASKRUNNER_RUNNER_EVENTS_ADDR"])
	require.Equal(t, "githubtoken.process."+cp.App+".internal:"+itoa(runnerPort), cp.Env["TASKRUNNER_RUNNER_TOKEN_ADDR"])
	// TLS files come from [[files]]; the CA key reaches dispatch only.
	guest := map[string][]string{}
	for _, f := range cp.Files {
		guest[f.GuestPath] = f.Processes
	}
	for _, v := range []string{"TASKRUNNER_TLS_CERT_FILE", "TASKRUNNER_TLS_KEY_FILE", "TASKRUNNER_RUNNER_CA_FILE", "TASKRUNNER_RUNNER_CA_KEY_FILE"} {
		require.Contains(t, guest, cp.Env[v], "%s must be written by [[files]]", v)
	}
	require.Equal(t, []string{"dispatch"}, guest[cp.Env["TASKRUNNER_RUNNER_CA_KEY_FILE"]])

	// Gateway app: the only public service, on the gateway's port, checked on /readyz.
	require.Equal(t, map[string]string{"gateway": "gateway"}, gw.Processes)
	require.Len(t, gw.Services, 1)
	s := gw.Services[0]
	require.Equal(t, http, s.InternalPort)
	require.Equal(t, http, portOf(t, gw.Env["TASKRUNNER_HTTP_ADDR"]))
	require.Equal(t, []string{"gateway"}, s.Processes)
	require.Len(t, s.HTTPChecks, 1)
	require.Equal(t, "/readyz", s.HTTPChecks[0].Path)
	var ports []int
	for _, p := range s.Ports {
		ports = append(ports, p.Port)
	}
	require.ElementsMatch(t, []int{80, 443}, ports)
	require.Equal(t, "task.process."+cp.App+".internal:"+itoa(grpc), gw.Env["TASKRUNNER_TASK_ADDR"])
	require.Equal(t, "events.process."+cp.App+".internal:"+itoa(grpc), gw.Env["TASKRUNNER_EVENTS_ADDR"])

	// Runner app: what the fly provider creates machines in; takes no connections.
	require.Equal(t, runner.App, cp.Env["TASKRUNNER_FLY_APP"])
	require.Equal(t, "fly", cp.Env["TASKRUNNER_SANDBOX_PROVIDER"])
	require.Empty(t, runner.Services)
	require.Empty(t, runner.Processes)
	require.Equal(t, runner.Build.Image, cp.Env["TASKRUNNER_FLY_IMAGE"])
	require.Equal(t, runner.Build.Image, cp.Env["TASKRUNNER_RUNNER_IMAGE"])
}

func TestFlySecretsAreListed(t *testing.T) {
	apps := flyApps(t)
	cp := apps["controlplane"]
	secrets := envFileKeys(t, filepath.Join(filepath.Dir(cp.path), "secrets.env.example"))
	for _, s := range cp.fileSecrets() {
		require.Contains(t, secrets, s, "[[files]] secret %s must be in the secrets list", s)
	}
	for _, n := range []string{"TASKRUNNER_DATABASE_URL", "TASKRUNNER_REDIS_URL", "TASKRUNNER_INTERNAL_TOKEN", "TASKRUNNER_FLY_API_TOKEN"} {
		require.Contains(t, secrets, n)
	}
	gw := envFileKeys(t, filepath.Join(filepath.Dir(apps["gateway"].path), "secrets.env.example"))
	require.NotContains(t, gw, "PKI_CA_KEY_PEM_B64", "the public app never holds the CA key")
	require.NotContains(t, gw, "TASKRUNNER_DATABASE_URL")
	// No secret in [env] (it is plain text in the repository and in `fly config show`).
	for _, app := range apps {
		for k := range app.Env {
			if secretName.MatchString(k) && !strings.HasSuffix(k, "_FILE") {
				require.Fail(t, "secret in [env]", "%s: %s", app.path, k)
			}
		}
	}
}
