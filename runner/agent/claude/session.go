package claude

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/taskrunner/taskrunner/runner/agent"
)

var _ agent.Resumable = (*Adapter)(nil)

// Name is "claude".
func (a *Adapter) Name() string { return "claude" }

// Session is the conversation so far: its id and the cost the CLI last reported for it.
func (a *Adapter) Session() agent.Session {
	a.mu.Lock()
	defer a.mu.Unlock()
	return agent.Session{ID: a.sessionID, TotalCostUSD: a.lastTotal}
}

// Resume continues s: the next stage runs with --resume s.ID, and the cost the CLI reports
// (cumulative over the conversation) is counted from s.TotalCostUSD on.
func (a *Adapter) Resume(s agent.Session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sessionID, a.lastTotal = s.ID, s.TotalCostUSD
}

// home is the CLI's HOME: Config.Home, else HOME in Env.
func (a *Adapter) home() string {
	if a.cfg.Home != "" {
		return a.cfg.Home
	}
	h := ""
	for _, kv := range a.cfg.Env {
		if v, ok := strings.CutPrefix(kv, "HOME="); ok {
			h = v
		}
	}
	return h
}

var nonAlnum = regexp.MustCompile(`[^A-Za-z0-9]`)

// ProjectSlug is the directory name under ~/.claude/projects/ the CLI keeps a working
// directory's transcripts in: the path with every character but letters and digits replaced
// by '-' (Claude Code 2.x; it shortens paths over 200 characters with a hash, which sandbox
// paths never reach).
func ProjectSlug(dir string) string {
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return nonAlnum.ReplaceAllString(dir, "-")
}

// sessionIDRE is what a session id looks like (a UUID); anything else is not used in a path.
var sessionIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,127}$`)

// SessionFiles lists the transcript ~/.claude/projects/<slug>/<id>.jsonl and what the CLI
// keeps beside it in <id>/ (subagent transcripts, large tool results), named claude/<id>.jsonl
// and claude/<id>/….
func (a *Adapter) SessionFiles() ([]agent.SessionFile, error) {
	id := a.SessionID()
	if id == "" {
		return nil, nil
	}
	if !sessionIDRE.MatchString(id) {
		return nil, fmt.Errorf("claude: unexpected session id %q", id)
	}
	dir := filepath.Join(a.home(), ".claude", "projects", ProjectSlug(a.cfg.Dir))
	transcript := filepath.Join(dir, id+".jsonl")
	if _, err := os.Stat(transcript); err != nil {
		// The CLI may have keyed the project differently; the id is unique across projects.
		matches, _ := filepath.Glob(filepath.Join(a.home(), ".claude", "projects", "*", id+".jsonl"))
		if len(matches) == 0 {
			return nil, fmt.Errorf("claude: no transcript of session %s under %s", id, filepath.Join(a.home(), ".claude", "projects"))
		}
		transcript, dir = matches[0], filepath.Dir(matches[0])
	}
	files := []agent.SessionFile{{Name: "claude/" + id + ".jsonl", Path: transcript}}
	extra := filepath.Join(dir, id)
	err := filepath.WalkDir(extra, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files = append(files, agent.SessionFile{Name: "claude/" + filepath.ToSlash(rel), Path: p})
		return nil
	})
	return files, err
}

// RestorePath puts claude/<rest> under ~/.claude/projects/<slug of this workspace>/, so that
// --resume finds the transcript from this sandbox's working directory.
func (a *Adapter) RestorePath(name string) (string, error) {
	rest, err := agent.CleanName(name, "claude/")
	if err != nil {
		return "", err
	}
	return filepath.Join(a.home(), ".claude", "projects", ProjectSlug(a.cfg.Dir), filepath.FromSlash(rest)), nil
}
