package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/stretchr/testify/require"
)

type dfStage struct {
	name, base string
	user       string // last USER of the stage
	env        []string
	runs       []string
	adds       []string // ADD sources
	copyFrom   []string
}

type dockerfile struct {
	stages []dfStage
}

// dockerfiles parses every Dockerfile under deploy/docker with buildkit's parser.
func dockerfiles(t *testing.T) map[string]dockerfile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(deployDir, "docker", "*Dockerfile"))
	require.NoError(t, err)
	require.Len(t, paths, 2, "the control-plane and the runner image")
	out := map[string]dockerfile{}
	for _, p := range paths {
		f, err := os.Open(p)
		require.NoError(t, err)
		res, err := parser.Parse(f)
		f.Close()
		require.NoError(t, err, p)
		require.Empty(t, res.Warnings, p)
		stages, metaArgs, err := instructions.Parse(res.AST, nil)
		require.NoError(t, err, p)
		require.Empty(t, metaArgs, "%s: no ARG before FROM: base images are written out, so they can be checked", p)
		var df dockerfile
		for _, st := range stages {
			s := dfStage{name: st.Name, base: st.BaseName}
			for _, c := range st.Commands {
				switch c := c.(type) {
				case *instructions.UserCommand:
					s.user = c.User
				case *instructions.EnvCommand:
					for _, kv := range c.Env {
						s.env = append(s.env, kv.Key)
					}
				case *instructions.RunCommand:
					s.runs = append(s.runs, strings.Join(c.CmdLine, " "))
				case *instructions.AddCommand:
					s.adds = append(s.adds, c.SourcePaths...)
				case *instructions.CopyCommand:
					if c.From != "" {
						s.copyFrom = append(s.copyFrom, c.From)
					}
				}
			}
			df.stages = append(df.stages, s)
		}
		out["deploy/docker/"+filepath.Base(p)] = df
	}
	return out
}

// requirePinned fails unless ref names a version: a digest, or a tag that is neither latest
// nor a bare major line without a number (e.g. "stable").
func requirePinned(t *testing.T, ref, what string) {
	t.Helper()
	if _, digest, ok := strings.Cut(ref, "@"); ok {
		require.Regexp(t, `^sha256:[0-9a-f]{64}$`, digest, what)
		return
	}
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	require.Greater(t, colon, slash, "%s: %q has no tag (that means latest)", what, ref)
	tag := ref[colon+1:]
	require.NotEqual(t, "latest", tag, what)
	// A version: at least major.minor (22.21.1-trixie-slim, 3.22.2, 0.1.0, 1.26.8-trixie).
	require.Regexp(t, `^v?\d+\.\d+`, tag, "%s: %q is not pinned to a version", what, ref)
}

func TestDockerfilesParseAndAreSafe(t *testing.T) {
	dfs := dockerfiles(t)
	download := regexp.MustCompile(`(^|[\s;&|(])(curl|wget|fetch|aria2c)(\s|$)|https?://|ftp://|git\s+clone`)
	for file, df := range dfs {
		require.NotEmpty(t, df.stages, file)
		names := map[string]bool{}
		for _, st := range df.stages {
			if !names[st.base] { // a named earlier stage is not an image
				requirePinned(t, st.base, file+" FROM "+st.base)
			}
			for _, r := range st.runs {
				require.NotRegexp(t, download, r, "%s: RUN downloads from a URL: %s", file, r)
			}
			for _, src := range st.adds {
				require.NotRegexp(t, `^(https?|git|ssh)://|^git@`, src, "%s: ADD from a URL", file)
			}
			for _, from := range st.copyFrom {
				require.True(t, names[from], "%s: COPY --from=%s is not an earlier stage (an image would be unpinned)", file, from)
			}
			names[st.name] = true
		}
		final := df.stages[len(df.stages)-1]
		require.NotEmpty(t, final.user, "%s: the final stage must set USER", file)
		user, _, _ := strings.Cut(final.user, ":")
		require.NotContains(t, []string{"root", "0", ""}, user, "%s: final stage runs as root", file)
		if uid, err := strconv.Atoi(user); err == nil {
			require.Positive(t, uid, file)
		}
	}
	// The runner image: uid 1000, the agent user it would drop to is the same uid, and the
	// pinned agent CLIs come from the lock file, not from a floating install.
	runner := dfs["deploy/docker/runner.Dockerfile"]
	final := runner.stages[len(runner.stages)-1]
	require.Equal(t, "1000:1000", final.user)
	require.Contains(t, final.env, "TASKRUNNER_AGENT_USER")
	require.Contains(t, final.env, "TASKRUNNER_WORKDIR")
	var npm string
	for _, st := range runner.stages {
		for _, r := range st.runs {
			if strings.Contains(r, "npm ") {
				npm += r
			}
		}
	}
	require.Contains(t, npm, "npm ci", "agents are installed exactly as package-lock.json says")
	require.NotContains(t, npm, "npm install", "npm install would float versions")
	raw, err := os.ReadFile(filepath.Join(deployDir, "docker", "runner.Dockerfile"))
	require.NoError(t, err)
	require.Regexp(t, `FROM node:22\.`, string(raw), "Node.js 22")
	require.Regexp(t, `apt-get install[^\n]*git[^\n]*bash[^\n]*ca-certificates`, string(raw))
	require.Contains(t, string(raw), `ENTRYPOINT ["/usr/local/bin/runner"]`)
}

func TestRunnerImageENVDefaultsAgree(t *testing.T) {
	// TASKRUNNER_AGENT_USER in the image is 1000 (the binary's default is 65534, meant for a
	// root runner on a host): it must stay the image's USER.
	raw, err := os.ReadFile(filepath.Join(deployDir, "docker", "runner.Dockerfile"))
	require.NoError(t, err)
	require.Regexp(t, `TASKRUNNER_AGENT_USER=1000\b`, string(raw))
	require.Regexp(t, `(?m)^USER 1000:1000$`, string(raw))
}

func itoa(i int) string { return strconv.Itoa(i) }
