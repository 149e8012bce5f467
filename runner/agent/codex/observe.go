package codex

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/taskrunner/taskrunner/runner/agent"
)

// stream turns JSONL events into observations. Calls come from exec's copy goroutines,
// stdout and stderr separately, so the shared parts are locked.
type stream struct {
	dir string
	obs agent.Observer

	mu        sync.Mutex
	threadID  string
	usage     *Usage
	failed    string // turn.failed message
	lastError string // last error event or error item
	text      string // last agent message
	turns     int    // turn.started events
	started   map[string]bool
	stderr    []string
}

const (
	maxBlockLines = 20
	maxStderrTail = 10
)

func (s *stream) line(b []byte) {
	if len(strings.TrimSpace(string(b))) == 0 {
		return
	}
	ev, err := ParseLine(b)
	if err != nil {
		s.obs.Log("malformed agent output: " + agent.Clip(string(b), 200))
		return
	}
	switch ev.Type {
	case "thread.started":
		s.mu.Lock()
		if s.threadID == "" {
			s.threadID = ev.ThreadID
		}
		s.mu.Unlock()
		s.obs.Log("agent thread " + ev.ThreadID)
	case "turn.started":
		s.mu.Lock()
		s.turns++
		s.mu.Unlock()
	case "turn.completed":
		s.mu.Lock()
		s.usage = ev.Usage
		s.mu.Unlock()
	case "turn.failed":
		s.mu.Lock()
		s.failed = ev.Message
		if s.failed == "" {
			s.failed = "no reason given"
		}
		s.mu.Unlock()
		s.obs.Log("stage failed: " + agent.Clip(ev.Message, 500))
	case "error":
		s.mu.Lock()
		s.lastError = agent.Clip(ev.Message, 500)
		s.mu.Unlock()
		s.obs.Log("error: " + agent.Clip(ev.Message, 500))
	case "item.started", "item.updated", "item.completed":
		s.item(ev.Type, ev.Item)
	}
}

func (s *stream) item(typ string, it *Item) {
	switch it.Type {
	case "command_execution":
		s.mu.Lock()
		if s.started == nil {
			s.started = map[string]bool{}
		}
		seen := s.started[it.ID]
		s.started[it.ID] = true
		s.mu.Unlock()
		script := ShellScript(it.Command)
		if !seen {
			s.obs.Log("> Bash: " + agent.Clip(agent.FirstLine(script), 300))
			s.obs.Command(script)
		}
		if typ != "item.completed" {
			return
		}
		lines := agent.LimitLines(it.Output, maxBlockLines)
		if it.Status != "completed" || (it.ExitCode != nil && *it.ExitCode != 0) {
			code := "?"
			if it.ExitCode != nil {
				code = fmt.Sprint(*it.ExitCode)
			}
			lines = append([]string{fmt.Sprintf("command %s (exit status %s)", orDefault(it.Status, "failed"), code)}, lines...)
		} else {
			// Files a successful shell command wrote through redirections count as touched,
			// as a Write would: Codex often writes files with heredocs.
			for _, f := range RedirectTargets(script) {
				s.obs.FileTouched(s.rel(f))
			}
		}
		for i := range lines {
			lines[i] = "  " + lines[i]
		}
		s.obs.Log(lines...)
	case "file_change":
		if typ != "item.completed" {
			return
		}
		for _, c := range it.Changes {
			verb := map[string]string{"add": "Write", "delete": "Delete", "update": "Edit"}[c.Kind]
			if verb == "" {
				verb = "Change"
			}
			s.obs.Log(fmt.Sprintf("> %s %s", verb, s.rel(c.Path)))
			s.obs.FileTouched(s.rel(c.Path))
		}
		if it.Status != "" && it.Status != "completed" {
			s.obs.Log("  patch " + it.Status)
		}
	case "agent_message":
		if typ != "item.completed" {
			return
		}
		s.mu.Lock()
		s.text = it.Text
		s.mu.Unlock()
		s.obs.Log(agent.LimitLines(it.Text, maxBlockLines)...)
	case "reasoning":
		if typ != "item.completed" {
			return
		}
		lines := agent.LimitLines(it.Text, 5)
		for i := range lines {
			lines[i] = "(thinking) " + lines[i]
		}
		s.obs.Log(lines...)
	case "mcp_tool_call":
		if typ == "item.started" {
			s.obs.Log(fmt.Sprintf("> mcp %s.%s", it.Server, it.Tool))
		}
	case "web_search":
		if typ == "item.started" {
			s.obs.Log("> web search " + agent.Clip(it.Query, 200))
		}
	case "todo_list":
		var lines []string
		for _, t := range it.Todos {
			mark := "[ ]"
			if t.Completed {
				mark = "[x]"
			}
			lines = append(lines, "  "+mark+" "+agent.Clip(t.Text, 200))
		}
		if typ == "item.started" && len(lines) > 0 {
			s.obs.Log(append([]string{"plan:"}, lines...)...)
		}
	case "error":
		// Non-fatal (e.g. unknown model metadata); a fatal error ends in turn.failed.
		s.mu.Lock()
		s.lastError = agent.Clip(it.Text, 500)
		s.mu.Unlock()
		s.obs.Log("warning: " + agent.Clip(it.Text, 500))
	}
}

// rel makes a path inside the workspace relative to it.
func (s *stream) rel(p string) string {
	if s.dir != "" && filepath.IsAbs(p) {
		if r, err := filepath.Rel(s.dir, p); err == nil && !strings.HasPrefix(r, "..") {
			return filepath.ToSlash(r)
		}
	}
	return p
}

// stdinNotice is printed by every `codex exec` whose stdin is not a terminal, even /dev/null.
const stdinNotice = "Reading additional input from stdin..."

func (s *stream) stderrLine(b []byte) {
	line := strings.TrimRight(string(b), "\r")
	if strings.TrimSpace(line) == "" || line == stdinNotice {
		return
	}
	// Warnings (e.g. no helper binaries under /tmp) are logged but do not explain a failure.
	if !strings.HasPrefix(line, "WARNING: ") {
		s.mu.Lock()
		s.stderr = append(s.stderr, agent.Clip(line, 500))
		if len(s.stderr) > maxStderrTail {
			s.stderr = s.stderr[1:]
		}
		s.mu.Unlock()
	}
	s.obs.Log("stderr: " + line)
}

func (s *stream) stderrTail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.stderr, " | ")
}

// shellRE matches the wrapper Codex reports commands in: /bin/bash -lc '<script>'.
var shellRE = regexp.MustCompile(`(?s)^(?:\S*/)?(?:ba|z)?sh -l?c (.+)$`)

// ShellScript returns the script of a command Codex ran through a shell (unquoted), or the
// command itself.
func ShellScript(command string) string {
	m := shellRE.FindStringSubmatch(strings.TrimSpace(command))
	if m == nil {
		return command
	}
	if w, ok := unquote(m[1]); ok {
		return w
	}
	return command
}

// unquote reads one POSIX shell word ('…', "…", backslash escapes) that spans all of s.
func unquote(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return "", false
			}
			b.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`\n", s[i+1]) >= 0 {
					i++
				}
				b.WriteByte(s[i])
			}
			if i >= len(s) {
				return "", false
			}
		case '\\':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i])
			}
		case ' ', '\t', '\n', ';', '&', '|':
			return "", false // more than one word
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// redirectRE finds output redirections (`> f`, `>> f`, `1> f`) and `tee [-a] f`; heredoc
// bodies are skipped by only scanning the first line of each command.
var redirectRE = regexp.MustCompile(`(?:(?:^|[^<>&0-9])[1]?>>?|\btee\s+(?:-a\s+)?)\s*(["']?)([^\s;&|<>()"']+)(["']?)`)

// RedirectTargets lists the files a shell script writes through redirections or tee
// (outside heredoc bodies), without /dev/* targets.
func RedirectTargets(script string) []string {
	var out []string
	inHeredoc := ""
	for _, line := range strings.Split(script, "\n") {
		if inHeredoc != "" {
			if strings.TrimSpace(line) == inHeredoc {
				inHeredoc = ""
			}
			continue
		}
		for _, m := range redirectRE.FindAllStringSubmatch(line, -1) {
			if f := m[2]; !strings.HasPrefix(f, "/dev/") && !strings.HasPrefix(f, "&") {
				out = append(out, f)
			}
		}
		if m := heredocRE.FindStringSubmatch(line); m != nil {
			inHeredoc = m[1]
		}
	}
	return out
}

var heredocRE = regexp.MustCompile(`<<-?\s*['"]?([A-Za-z_][A-Za-z0-9_]*)['"]?`)

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
