package helpcheck

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// secrets are set in the environment of every run; none of the values (nor
// the passwords inside the URLs) may appear in any output.
var secrets = map[string]string{
	"TASKRUNNER_TOKEN":                  "trt_hcTOKENq7Zp2Lw9xKc4",
	"TASKRUNNER_DATABASE_URL":           "postgres://taskrunner:hcDBPASSWORDv3Rt8@db.internal:5432/taskrunner?sslmode=disable",
	"TASKRUNNER_REDIS_URL":              "redis://default:hcREDISPASSWORDm2Qx@redis.internal:6379/0",
	"TASKRUNNER_INTERNAL_TOKEN":         "trt_hcINTERNALb8Nf5Hs1",
	"TASKRUNNER_GATEWAY_INTERNAL_TOKEN": "trt_hcGATEWAYd4Wk9Jp6",
	"ANTHROPIC_API_KEY":                 "sk-ant-hcANTHROPICr5Ty7Ui2",
	"OPENAI_API_KEY":                    "sk-hcOPENAIg6Hj3Kl8",
	"GITHUB_TOKEN":                      "ghp_hcGITHUBz1Xc5Vb7",
	"TASKRUNNER_GITHUB_TOKEN":           "ghp_hcTRGITHUBn9Mq2We4",
	"TASKRUNNER_GITHUB_WEBHOOK_SECRET":  "hcWEBHOOKSECRETa3Sd6Fg",
	"TASKRUNNER_GITHUB_APP_KEY":         "hcAPPKEYPEMo4Pi7Uy1",
	"TASKRUNNER_GITHUB_CACHE_KEY":       "hcCACHEKEYe5Rw8Qt2",
	"TASKRUNNER_FLY_API_TOKEN":          "hcFLYTOKENc7Vx1Zb3",
	"TASKRUNNER_BOXLITE_API_KEY":        "hcBOXLITEKEYk2Lj6Hg9",
	"TASKRUNNER_TLS_KEY_PEM":            "hcTLSKEYPEMf8Ds4Aa5",
}

// needles are what must not appear: every value, and the passwords alone.
func needles() []string {
	out := []string{"hcDBPASSWORDv3Rt8", "hcREDISPASSWORDm2Qx"}
	for _, v := range secrets {
		out = append(out, v)
	}
	return out
}

func secretEnv() []string {
	env := os.Environ()
	for k, v := range secrets {
		env = append(env, k+"="+v)
	}
	return env
}

// binaries maps each binary to its package and whether --help exits 0
// (the runner has no flags and is configured only by its sandbox's
// environment; forge reports help as an error).
var binaries = []struct {
	name, pkg string
	helpOK    bool
}{
	{"taskrunnerd", "github.com/taskrunner/taskrunner/services/cmd/taskrunnerd", true},
	{"gateway", "github.com/taskrunner/taskrunner/gateway/cmd/gateway", true},
	{"runner", "github.com/taskrunner/taskrunner/runner/cmd/runner", false},
	{"devstack", "github.com/taskrunner/taskrunner/tools/cmd/devstack", true},
	{"forge", "github.com/taskrunner/taskrunner/tools/cmd/forge", false},
	{"modelapi", "github.com/taskrunner/taskrunner/tools/cmd/modelapi", true},
	{"taskctl", "github.com/taskrunner/taskrunner/tools/cmd/taskctl", true},
}

// binDir holds the binaries, built once in TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "helpcheck")
	if err != nil {
		panic(err)
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, b := range binaries {
		args = append(args, b.pkg)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		fmt.Fprintf(os.Stderr, "helpcheck: go build: %v\n%s", err, out)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// run runs bin with args and the secrets in its environment. A --help that
// does not return promptly started the program instead: that fails too.
func run(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = secretEnv()
	cmd.Dir = t.TempDir() // nothing a binary might create lands in the repository
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "%s %v did not exit:\n%s", filepath.Base(bin), args, out)
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return string(out), code
}

func requireNoSecret(t *testing.T, what, out string) {
	t.Helper()
	for _, n := range needles() {
		require.NotContains(t, out, n, "%s shows a secret from the environment:\n%s", what, out)
	}
}

func TestHelpShowsNoSecret(t *testing.T) {
	dir := binDir
	for _, b := range binaries {
		t.Run(b.name, func(t *testing.T) {
			bin := filepath.Join(dir, b.name)
			for _, flag := range []string{"--help", "-h"} {
				out, code := run(t, bin, flag)
				require.NotEmpty(t, strings.TrimSpace(out), "%s %s printed nothing", b.name, flag)
				requireNoSecret(t, b.name+" "+flag, out)
				if b.helpOK {
					require.Equal(t, 0, code, "%s %s:\n%s", b.name, flag, out)
				}
			}
		})
	}
	// Subcommands with flags of their own.
	for args, flag := range map[string]string{"taskrunnerd migrate --help": "-services", "devstack deps --help": "-dev-dir", "devstack up --help": "-bin-dir"} {
		f := strings.Fields(args)
		out, code := run(t, filepath.Join(dir, f[0]), f[1:]...)
		requireNoSecret(t, args, out)
		require.Equal(t, 0, code, "%s:\n%s", args, out)
		require.Contains(t, out, flag, "%s prints its flags:\n%s", args, out)
	}
}

// TestEveryTaskctlCommandHelpHasAnExampleAndNoSecret walks taskctl's command
// tree through its own help output.
func TestEveryTaskctlCommandHelpHasAnExampleAndNoSecret(t *testing.T) {
	dir := binDir
	bin := filepath.Join(dir, "taskctl")
	seen := 0
	var walk func(path []string)
	walk = func(path []string) {
		out, code := run(t, bin, append(append([]string{}, path...), "--help")...)
		name := strings.Join(append([]string{"taskctl"}, path...), " ")
		require.Equal(t, 0, code, "%s --help:\n%s", name, out)
		requireNoSecret(t, name+" --help", out)
		if len(path) == 0 || path[0] != "completion" {
			require.Contains(t, out, "Examples:", "%s --help shows no example:\n%s", name, out)
		}
		seen++
		for _, sub := range subcommands(out) {
			if sub != "help" {
				walk(append(append([]string{}, path...), sub))
			}
		}
	}
	walk(nil)
	// root, task (8 with watch), token (4), pki (2), completion (5): the walk
	// really descended.
	require.GreaterOrEqual(t, seen, 15)
}

// subcommands parses cobra's "Available Commands:" section.
func subcommands(help string) []string {
	var out []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Available Commands:"):
			in = true
		case in && strings.TrimSpace(line) == "":
			in = false
		case in:
			if f := strings.Fields(line); len(f) > 0 {
				out = append(out, f[0])
			}
		}
	}
	return out
}

// TestConfigurationErrorsShowNoSecret: a bad setting is named in the error,
// with the password of a URL hidden.
func TestConfigurationErrorsShowNoSecret(t *testing.T) {
	dir := binDir
	cases := []struct {
		bin  string
		env  map[string]string
		args []string
		want string
	}{
		{"taskrunnerd", map[string]string{"TASKRUNNER_DATABASE_URL": "mysql://taskrunner:hcDBPASSWORDv3Rt8@db.internal/taskrunner"}, nil, "TASKRUNNER_DATABASE_URL"},
		{"taskrunnerd", map[string]string{"TASKRUNNER_REDIS_URL": "memcache://default:hcREDISPASSWORDm2Qx@redis.internal:6379"}, nil, "TASKRUNNER_REDIS_URL"},
		// An unreachable database: the connection error names the host, not the password.
		{"taskctl", map[string]string{"TASKRUNNER_DATABASE_URL": "postgres://taskrunner:hcDBPASSWORDv3Rt8@127.0.0.1:1/taskrunner?connect_timeout=2"},
			[]string{"token", "create", "--owner", "alice"}, "127.0.0.1"},
		// A refused token: the error does not echo it.
		{"taskctl", map[string]string{"TASKRUNNER_ADDR": "127.0.0.1:1"}, []string{"task", "list"}, "Unavailable"},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, filepath.Join(dir, c.bin), c.args...)
		cmd.Env = secretEnv()
		for k, v := range c.env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Dir = t.TempDir()
		out, err := cmd.CombinedOutput()
		cancel()
		require.Error(t, err, "%s %v must fail:\n%s", c.bin, c.args, out)
		require.Contains(t, string(out), c.want, "%s %v", c.bin, c.args)
		requireNoSecret(t, c.bin+" error", string(out))
	}
}
