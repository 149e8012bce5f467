package stages

import (
	"path"
	"regexp"
	"strings"
	"sync"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// tracker follows the task's stage and OpenSpec change from stage boundaries and from what
// the agent does: a file written under openspec/changes/<name>/ means the proposal is being
// written, a code file edited after that means apply, and `openspec archive` or a file under
// openspec/changes/archive/ means archive. The stage only moves forward; every move is
// reported once through onEnter.
type tracker struct {
	onEnter func(stage taskrunnerv1.TaskStage, change string)

	mu     sync.Mutex
	stage  taskrunnerv1.TaskStage
	change string
}

var (
	changePathRE  = regexp.MustCompile(`(?:^|/)openspec/changes/([a-z0-9][a-z0-9._-]*)/`)
	archivePathRE = regexp.MustCompile(`(?:^|/)openspec/changes/archive/(?:\d{4}-\d{2}-\d{2}-)?([a-z0-9][a-z0-9._-]*)(?:/|$)`)
	archiveCmdRE  = regexp.MustCompile(`\bopenspec\s+archive\s+(?:-\S+\s+)*([a-z0-9][a-z0-9._-]*)`)
	newChangeRE   = regexp.MustCompile(`\bopenspec\s+new\s+change\s+["']?([a-z0-9][a-z0-9._-]*)`)
)

func (t *tracker) current() (taskrunnerv1.TaskStage, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stage, t.change
}

// enter moves to stage if it is ahead of the current one.
func (t *tracker) enter(stage taskrunnerv1.TaskStage) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advanceLocked(stage)
}

func (t *tracker) advanceLocked(stage taskrunnerv1.TaskStage) {
	if stage <= t.stage {
		return
	}
	t.stage = stage
	t.onEnter(stage, t.change)
}

func (t *tracker) setChange(name string) {
	if name != "" && name != "archive" {
		t.change = name
	}
}

// fileTouched observes a file the agent wrote (workspace-relative or absolute).
func (t *tracker) fileTouched(p string) {
	p = path.Clean(strings.ReplaceAll(p, "\\", "/"))
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := archivePathRE.FindStringSubmatch(p); m != nil {
		t.setChange(m[1])
		t.advanceLocked(taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE)
		return
	}
	if m := changePathRE.FindStringSubmatch(p); m != nil && m[1] != "archive" {
		t.setChange(m[1])
		t.advanceLocked(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE)
		return
	}
	// A code change after the proposal exists is the implementation.
	if t.change != "" && t.stage == taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE &&
		!strings.HasPrefix(p, "openspec/") && !strings.HasPrefix(p, ".claude/") && !strings.Contains(p, "/openspec/") {
		t.advanceLocked(taskrunnerv1.TaskStage_TASK_STAGE_APPLY)
	}
}

// command observes a shell command the agent ran.
func (t *tracker) command(cmd string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := archiveCmdRE.FindStringSubmatch(cmd); m != nil {
		t.setChange(m[1])
		t.advanceLocked(taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE)
		return
	}
	if m := newChangeRE.FindStringSubmatch(cmd); m != nil {
		t.setChange(m[1])
		t.advanceLocked(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE)
	}
}
