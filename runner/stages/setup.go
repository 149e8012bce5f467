package stages

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/taskrunner/taskrunner/runner/proc"
	"github.com/taskrunner/taskrunner/runner/workspace"
)

// PrepareDirs creates root (0755, so the agent user can traverse it), root/home (the agent's
// HOME) and root/repo (the checkout), both owned by user.
func PrepareDirs(root string, user *proc.User) (home, repo string, err error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", "", err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return "", "", err
	}
	home, repo = filepath.Join(root, "home"), filepath.Join(root, "repo")
	for _, d := range []string{home, repo} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", "", fmt.Errorf("workdir: %w", err)
		}
		if err := proc.Chown(d, user); err != nil {
			return "", "", fmt.Errorf("workdir: %w", err)
		}
	}
	return home, repo, nil
}

// defaultPath is used when the runner's environment has no PATH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// passThrough are prefixes of the runner's variables the agent receives: its model
// credentials and settings, and proxy settings. Nothing else of the runner's environment (the
// task certificate, addresses) reaches the agent.
var passThrough = []string{"ANTHROPIC_", "CLAUDE_CODE_", "HTTP_PROXY=", "HTTPS_PROXY=", "NO_PROXY=", "http_proxy=", "https_proxy=", "no_proxy="}

// BaseEnv is the environment of git and openspec: PATH (extraPath first), HOME and locale.
func BaseEnv(environ []string, home string, extraPath []string) []string {
	path := defaultPath
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok && v != "" {
			path = v
		}
	}
	if len(extraPath) > 0 {
		path = strings.Join(extraPath, string(os.PathListSeparator)) + string(os.PathListSeparator) + path
	}
	return []string{"PATH=" + path, "HOME=" + home, "LANG=C.UTF-8", "TERM=dumb", "NO_COLOR=1"}
}

// AgentEnv is the agent CLI's environment: BaseEnv, the passed-through model variables, and
// settings that keep the CLI quiet and quick to fail (CLAUDE_CODE_MAX_RETRIES=2 unless set).
func AgentEnv(environ []string, home string, extraPath []string, asRoot bool) []string {
	env := BaseEnv(environ, home, extraPath)
	retries := false
	for _, kv := range environ {
		for _, p := range passThrough {
			if strings.HasPrefix(kv, p) {
				env = append(env, kv)
				if strings.HasPrefix(kv, "CLAUDE_CODE_MAX_RETRIES=") {
					retries = true
				}
				break
			}
		}
	}
	if !retries {
		env = append(env, "CLAUDE_CODE_MAX_RETRIES=2")
	}
	env = append(env,
		"DISABLE_TELEMETRY=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1",
		"OPENSPEC_TELEMETRY=0", "DO_NOT_TRACK=1",
		"GIT_AUTHOR_NAME="+workspace.AuthorName, "GIT_AUTHOR_EMAIL="+workspace.AuthorEmail,
		"GIT_COMMITTER_NAME="+workspace.AuthorName, "GIT_COMMITTER_EMAIL="+workspace.AuthorEmail,
	)
	if asRoot {
		// Only when no unprivileged user could be used: Claude Code refuses
		// bypassPermissions as root otherwise.
		env = append(env, "IS_SANDBOX=1")
	}
	return env
}
