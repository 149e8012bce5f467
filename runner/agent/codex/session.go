package codex

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/taskrunner/taskrunner/runner/agent"
)

var _ agent.Resumable = (*Adapter)(nil)

// Name is "codex".
func (a *Adapter) Name() string { return "codex" }

// Session is the thread so far: its id and the cumulative usage the CLI last reported for it.
func (a *Adapter) Session() agent.Session {
	a.mu.Lock()
	defer a.mu.Unlock()
	return agent.Session{ID: a.threadID, InputTokens: a.lastUsage.InputTokens, CachedInputTokens: a.lastUsage.CachedInputTokens,
		OutputTokens: a.lastUsage.OutputTokens, ReasoningOutputTokens: a.lastUsage.ReasoningOutputTokens}
}

// Resume continues thread s: the next stage runs `codex exec resume <id>`, and the usage the
// CLI reports (cumulative over the thread) is counted from s's figures on. The cost and the
// budget count this run only.
func (a *Adapter) Resume(s agent.Session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.threadID = s.ID
	a.lastUsage = Usage{InputTokens: s.InputTokens, CachedInputTokens: s.CachedInputTokens, OutputTokens: s.OutputTokens,
		ReasoningOutputTokens: s.ReasoningOutputTokens}
}

var threadIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,127}$`)

// SessionFiles lists the thread's rollout files under CODEX_HOME/sessions/ (the CLI names them
// rollout-<time>-<thread id>.jsonl, in dated directories), named codex/sessions/….
func (a *Adapter) SessionFiles() ([]agent.SessionFile, error) {
	id := a.ThreadID()
	if id == "" {
		return nil, nil
	}
	if !threadIDRE.MatchString(id) {
		return nil, fmt.Errorf("codex: unexpected thread id %q", id)
	}
	var files []agent.SessionFile
	root := filepath.Join(a.cfg.Home, "sessions")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() || !strings.Contains(d.Name(), id) {
			return nil
		}
		rel, err := filepath.Rel(a.cfg.Home, p)
		if err != nil {
			return err
		}
		files = append(files, agent.SessionFile{Name: "codex/" + filepath.ToSlash(rel), Path: p})
		return nil
	})
	if err == nil && len(files) == 0 {
		return nil, fmt.Errorf("codex: no rollout of thread %s under %s", id, root)
	}
	return files, err
}

// RestorePath puts codex/<rest> under this sandbox's CODEX_HOME.
func (a *Adapter) RestorePath(name string) (string, error) {
	rest, err := agent.CleanName(name, "codex/")
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(rest, "sessions/") {
		return "", fmt.Errorf("session file %q: not a Codex rollout", name)
	}
	return filepath.Join(a.cfg.Home, filepath.FromSlash(rest)), nil
}
