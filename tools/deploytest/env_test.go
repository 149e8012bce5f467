package deploytest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/caarlos0/env/v11"
	"github.com/stretchr/testify/require"

	gwconfig "github.com/taskrunner/taskrunner/gateway/config"
	"github.com/taskrunner/taskrunner/gateway/webhook"
	runnerconfig "github.com/taskrunner/taskrunner/runner/config"
	"github.com/taskrunner/taskrunner/services/config"
	"github.com/taskrunner/taskrunner/services/dispatch"
	"github.com/taskrunner/taskrunner/services/githubtoken"
	"github.com/taskrunner/taskrunner/services/sandbox/boxlite"
	"github.com/taskrunner/taskrunner/services/sandbox/docker"
	"github.com/taskrunner/taskrunner/services/sandbox/fly"
	"github.com/taskrunner/taskrunner/services/sandbox/kubernetes"
)

// deployDir is the repository's deploy/ directory (tests run in tools/deploytest).
var deployDir = filepath.Join("..", "..", "deploy")

// envVar is one variable a binary reads, from a struct's `env` tag.
type envVar struct {
	Name       string
	Default    string
	HasDefault bool
	Required   bool // the tag says required or notEmpty
	Owner      string
}

// configs are the configuration structs of every binary (taskctl has none: see taskctlVars).
var configs = map[string]any{
	"taskrunnerd":         config.Daemon{},
	"dispatch":            dispatch.Config{},
	"githubtoken":         githubtoken.Config{},
	"provider/docker":     docker.Config{},
	"provider/fly":        fly.Config{},
	"provider/kubernetes": kubernetes.Config{},
	"provider/boxlite":    boxlite.Config{},
	"gateway":             gwconfig.Gateway{},
	"gateway/webhook":     webhook.Config{},
	"runner":              runnerconfig.Config{},
}

// structVars reflects over v's fields and returns their variables.
func structVars(owner string, v any) []envVar {
	var out []envVar
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			tag, ok := f.Tag.Lookup("env")
			if !ok {
				if f.Type.Kind() == reflect.Struct {
					walk(f.Type)
				}
				continue
			}
			parts := strings.Split(tag, ",")
			def, hasDef := f.Tag.Lookup("envDefault")
			out = append(out, envVar{Name: parts[0], Default: def, HasDefault: hasDef, Owner: owner,
				Required: slices.Contains(parts[1:], "required") || slices.Contains(parts[1:], "notEmpty")})
		}
	}
	walk(reflect.TypeOf(v))
	return out
}

// taskctlVars finds the variables taskctl reads: it has no config struct (cobra flags with
// environment fallbacks), so its source is parsed for os.Getenv("X") and envOr("X", …).
func taskctlVars(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "cmd", "taskctl", "main.go"), nil, 0)
	require.NoError(t, err)
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		name := ""
		switch fn := call.Fun.(type) {
		case *ast.SelectorExpr:
			if x, ok := fn.X.(*ast.Ident); ok && x.Name == "os" && (fn.Sel.Name == "Getenv" || fn.Sel.Name == "LookupEnv") {
				name = fn.Sel.Name
			}
		case *ast.Ident:
			if fn.Name == "envOr" {
				name = fn.Name
			}
		}
		if lit, ok := call.Args[0].(*ast.BasicLit); ok && name != "" && lit.Kind == token.STRING {
			s, _ := strconv.Unquote(lit.Value)
			out = append(out, s)
		}
		return true
	})
	// Flags that fall back to a variable are listed in taskctl's envFlags
	// table ({flag, variable} pairs).
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "envFlags" {
			return true
		}
		ast.Inspect(vs, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, _ := strconv.Unquote(lit.Value); strings.HasPrefix(s, "TASKRUNNER_") {
					out = append(out, s)
				}
			}
			return true
		})
		return false
	})
	require.NotEmpty(t, out, "taskctl reads no variables? the parser missed os.Getenv/envOr/envFlags")
	return out
}

// standardVars are read by libraries or programs the binaries run, not by a config struct.
var standardPrefixes = []string{
	"OTEL_",        // OpenTelemetry SDK (services/telemetry, autoexport)
	"ANTHROPIC_",   // Claude Code in the sandbox (passed via TASKRUNNER_RUNNER_PASS_ENV)
	"OPENAI_",      // Codex in the sandbox
	"CLAUDE_CODE_", // Claude Code settings the runner passes through (stages.AgentEnv)
}

var standardNames = []string{
	"PATH", "HOME", // the runner image's search path; the agent's HOME is set by the runner
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", // egress proxy, passed through to the agent
	"DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "DOCKER_API_VERSION", // docker client fallback
	"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", // in-cluster API server (kubernetes provider)
	"FLY_FLAPS_BASE_URL", // fly-go's Machines API fallback
}

// deployOnlyVars are consumed by Compose itself or by third-party images, never by our
// binaries. Each must be listed in .env.example.
var deployOnlyVars = map[string]string{
	"POSTGRES_PASSWORD": "the postgres image, and interpolated into TASKRUNNER_DATABASE_URL",
	"DOCKER_GID":        "Compose group of the docker-socket-proxy (the host's docker socket group)",
}

type known struct {
	vars map[string][]envVar
}

func knownVars(t *testing.T) known {
	t.Helper()
	k := known{vars: map[string][]envVar{}}
	for owner, c := range configs {
		for _, v := range structVars(owner, c) {
			k.vars[v.Name] = append(k.vars[v.Name], v)
		}
	}
	for _, n := range taskctlVars(t) {
		k.vars[n] = append(k.vars[n], envVar{Name: n, Owner: "taskctl"})
	}
	return k
}

// reads reports whether a binary reads name, directly or as a standard variable.
func (k known) reads(name string) bool {
	if _, ok := k.vars[name]; ok {
		return true
	}
	if slices.Contains(standardNames, name) {
		return true
	}
	for _, p := range standardPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// defaultPort returns the port of the envDefault of name (host:port), read by reflection.
func (k known) defaultPort(t *testing.T, name string) int {
	t.Helper()
	vs := k.vars[name]
	require.NotEmpty(t, vs, "%s is read by no binary", name)
	_, port, ok := strings.Cut(vs[0].Default, ":")
	require.True(t, ok, "%s default %q has no port", name, vs[0].Default)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return p
}

var errVarRE = regexp.MustCompile(`\b(TASKRUNNER_[A-Z0-9_]+|TRACEPARENT)\b`)

// requiredVars returns the variables a binary cannot start without, derived from the code:
// tags marked required/notEmpty, variables named by Validate on a default configuration, and
// for the sandbox providers (whose errors name Go fields) the fields Validate asks for one by
// one, mapped to their tags.
func requiredVars(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for owner, c := range configs {
		for _, v := range structVars(owner, c) {
			if v.Required {
				out[v.Name] = owner
			}
		}
	}
	validate := func(owner string, ptr any) error {
		require.NoError(t, env.ParseWithOptions(ptr, env.Options{Environment: map[string]string{}}), owner)
		type validator interface{ Validate() error }
		return reflect.ValueOf(ptr).Elem().Interface().(validator).Validate()
	}
	for _, owner := range []string{"taskrunnerd", "dispatch", "githubtoken", "gateway", "gateway/webhook"} {
		ptr := reflect.New(reflect.TypeOf(configs[owner])).Interface()
		if err := validate(owner, ptr); err != nil {
			for _, m := range errVarRE.FindAllString(err.Error(), -1) {
				out[m] = owner
			}
		}
	}
	for _, owner := range []string{"provider/docker", "provider/fly", "provider/kubernetes", "provider/boxlite"} {
		for name := range providerRequired(t, owner) {
			out[name] = owner
		}
	}
	return out
}

// providerRequired fills the fields a provider's Validate names, one at a time, until it
// passes; it returns their variables.
func providerRequired(t *testing.T, owner string) map[string]bool {
	t.Helper()
	typ := reflect.TypeOf(configs[owner])
	ptr := reflect.New(typ)
	require.NoError(t, env.ParseWithOptions(ptr.Interface(), env.Options{Environment: map[string]string{}}))
	out := map[string]bool{}
	for range typ.NumField() + 1 {
		err := ptr.Elem().Interface().(interface{ Validate() error }).Validate()
		if err == nil {
			return out
		}
		filled := false
		for f := range typ.Fields() {
			if f.Type.Kind() != reflect.String || ptr.Elem().FieldByName(f.Name).String() != "" {
				continue
			}
			if !regexp.MustCompile(`\b` + f.Name + `\b`).MatchString(err.Error()) {
				continue
			}
			val := "x"
			if strings.Contains(f.Name, "URL") {
				val = "http://example.test"
			}
			ptr.Elem().FieldByName(f.Name).SetString(val)
			name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
			out[name] = true
			filled = true
			break
		}
		require.True(t, filled, "%s: cannot tell which field this error asks for: %v", owner, err)
	}
	require.Fail(t, "validation never passed", owner)
	return nil
}

func TestRequiredVarsAreFound(t *testing.T) {
	// The derivation must find what the code obviously requires; a test that cannot fail is
	// a defect, so pin a few.
	req := requiredVars(t)
	for _, name := range []string{"TASKRUNNER_TASK_ID", "TASKRUNNER_EVENTS_ADDR", "TASKRUNNER_GITHUB_APP_ID",
		"TASKRUNNER_DOCKER_IMAGE", "TASKRUNNER_FLY_APP", "TASKRUNNER_FLY_API_TOKEN", "TASKRUNNER_K8S_NAMESPACE", "TASKRUNNER_BOXLITE_URL"} {
		require.Contains(t, req, name)
	}
	require.NotContains(t, req, "TASKRUNNER_DATABASE_URL", "it has a default")
}

// deploySources collects every variable name each deploy file mentions, by file.
type mention struct{ file, name string }

func TestEveryDeployVariableIsReadByABinary(t *testing.T) {
	k := knownVars(t)
	var mentions []mention
	add := func(file string, names ...string) {
		for _, n := range names {
			mentions = append(mentions, mention{file, n})
		}
	}
	// Compose: services of our images, interpolations, .env.example.
	c := composeFacts(t)
	for file, names := range c.ourEnv {
		add(file, names...)
	}
	for _, n := range c.interpolated {
		if _, ok := deployOnlyVars[n]; !ok {
			add("deploy/compose/compose.yaml ${…}", n)
		}
	}
	for _, n := range envFileKeys(t, filepath.Join(deployDir, "compose", ".env.example")) {
		if _, ok := deployOnlyVars[n]; !ok {
			add("deploy/compose/.env.example", n)
		}
	}
	// Kubernetes: ConfigMaps, Secrets, container env, env refs, the secretGenerator input.
	for _, m := range k8sEnvMentions(t) {
		mentions = append(mentions, m)
	}
	add("deploy/k8s/secrets.env.example", envFileKeys(t, filepath.Join(deployDir, "k8s", "secrets.env.example"))...)
	// Fly: [env] and secrets (file-backed secrets are consumed by Fly, not by a binary).
	for _, app := range flyApps(t) {
		for n := range app.Env {
			add(app.path, n)
		}
		secrets := filepath.Join(filepath.Dir(app.path), "secrets.env.example")
		if _, err := os.Stat(secrets); err != nil {
			continue // the runner app has no secrets: Dispatch passes each sandbox its own
		}
		for _, n := range envFileKeys(t, secrets) {
			if !slices.Contains(app.fileSecrets(), n) {
				add(filepath.Join(filepath.Dir(app.path), "secrets.env.example"), n)
			}
		}
	}
	// Dockerfiles: ENV in every stage.
	for file, df := range dockerfiles(t) {
		for _, st := range df.stages {
			add(file, st.env...)
		}
	}
	// deploy/README.md: every TASKRUNNER_* it names.
	readme, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	require.NoError(t, err)
	for _, n := range regexp.MustCompile(`\bTASKRUNNER_[A-Z0-9_]*[A-Z0-9]\b`).FindAllString(string(readme), -1) {
		if n == "TASKRUNNER_PROVIDER" { // the README's placeholder in TASKRUNNER_<PROVIDER>_*
			continue
		}
		add("deploy/README.md", n)
	}

	require.Greater(t, len(mentions), 100, "the collectors found too little to be checking anything")
	var bad []string
	for _, m := range mentions {
		if !k.reads(m.name) {
			bad = append(bad, m.file+": "+m.name)
		}
	}
	sort.Strings(bad)
	require.Empty(t, slices.Compact(bad), "variables no binary reads (typo, or a setting that was removed)")
}

func TestDeployOnlyVariablesAreDocumented(t *testing.T) {
	keys := envFileKeys(t, filepath.Join(deployDir, "compose", ".env.example"))
	for n, why := range deployOnlyVars {
		require.Contains(t, keys, n, "%s (%s) must be listed in .env.example", n, why)
	}
}

func TestRequiredVariablesAreSetOrDocumented(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	require.NoError(t, err)
	documented := map[string]bool{}
	for _, n := range regexp.MustCompile(`\b[A-Z][A-Z0-9_]+\b`).FindAllString(string(readme), -1) {
		documented[n] = true
	}
	for _, n := range envFileKeys(t, filepath.Join(deployDir, "compose", ".env.example")) {
		documented[n] = true
	}
	var missing []string
	for name, owner := range requiredVars(t) {
		if !documented[name] {
			missing = append(missing, name+" ("+owner+")")
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "required variables neither in deploy/README.md nor in .env.example")
}

// Each path must set every variable its sandbox provider requires.
func TestEachPathConfiguresItsProvider(t *testing.T) {
	prefix := map[string]string{"docker": "provider/docker", "fly": "provider/fly", "kubernetes": "provider/kubernetes"}
	paths := map[string]map[string]string{}
	// Compose: dispatch's environment, plus .env.example for the interpolated values.
	c := composeFacts(t)
	paths["compose"] = c.dispatchEnv
	// Kubernetes: the dispatch container's env.
	paths["kubernetes"] = k8sDispatchEnv(t)
	// Fly: [env] and the secrets list of the services app.
	fenv := map[string]string{}
	for _, app := range flyApps(t) {
		if _, ok := app.Processes["dispatch"]; ok {
			for k, v := range app.Env {
				fenv[k] = v
			}
			for _, n := range envFileKeys(t, filepath.Join(filepath.Dir(app.path), "secrets.env.example")) {
				if _, ok := fenv[n]; !ok {
					fenv[n] = "(secret)"
				}
			}
		}
	}
	paths["fly"] = fenv
	want := map[string]string{"compose": "docker", "kubernetes": "kubernetes", "fly": "fly"}
	for path, env := range paths {
		provider := env["TASKRUNNER_SANDBOX_PROVIDER"]
		require.Equal(t, want[path], provider, "%s: TASKRUNNER_SANDBOX_PROVIDER", path)
		for name := range providerRequired(t, prefix[provider]) {
			require.NotEmpty(t, env[name], "%s: the %s provider needs %s", path, provider, name)
		}
		require.NotEmpty(t, env["TASKRUNNER_RUNNER_IMAGE"], "%s: TASKRUNNER_RUNNER_IMAGE", path)
		for _, n := range []string{"TASKRUNNER_RUNNER_CA_FILE", "TASKRUNNER_RUNNER_CA_KEY_FILE"} {
			require.NotEmpty(t, env[n], "%s: dispatch mints task certificates and needs %s", path, n)
		}
	}
}

// envFileKeys reads NAME=value lines (comments and blank lines skipped).
func envFileKeys(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		require.True(t, ok, "%s:%d: want NAME=value", path, i+1)
		require.Regexp(t, `^[A-Z][A-Z0-9_]*$`, k, "%s:%d", path, i+1)
		out = append(out, k)
	}
	return out
}
