package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

func TestProgressRendersStagesDiffAndOutcome(t *testing.T) {
	p := &progress{}
	evs := []*taskrunnerv1.Event{
		{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE}}},
		{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"a", "b", "c", "d", "e", "f"}}}},
		{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_APPLY}}},
		{Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{Additions: 12, Deletions: 3, FilesChanged: 2}}},
		{Payload: &taskrunnerv1.Event_Usage{Usage: &taskrunnerv1.Usage{CostUsd: 0.25, TokensIn: 100, TokensOut: 20}}},
	}
	for _, ev := range evs {
		require.Equal(t, -1, p.apply(ev))
	}
	var b strings.Builder
	p.render(&b, "t1")
	out := b.String()
	require.Contains(t, out, "✓ explore")
	require.Contains(t, out, "✓ propose")
	require.Contains(t, out, "▶ apply")
	require.Contains(t, out, "· archive")
	require.Contains(t, out, "+12 -3 in 2 files")
	require.Contains(t, out, "$0.2500")
	require.NotContains(t, out, "│ a\n", "only the last five log lines")
	require.Contains(t, out, "│ f")

	// The runner's completed does not end the watch: the task awaits review.
	require.Equal(t, -1, p.apply(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Completed{Completed: &taskrunnerv1.Completed{PrUrl: "http://forge/pr/1"}}}))
	require.Equal(t, -1, p.apply(statusChange(taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW, "runner", "pull request opened", 0)))
	require.Equal(t, 0, p.apply(statusChange(taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW, taskrunnerv1.TaskStatus_TASK_STATUS_DONE, "github", "pull request merged", 0)))
	require.Equal(t, 1, (&progress{}).apply(statusChange(taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, "reaper", "timeout", 0)))
	require.Equal(t, 2, (&progress{}).apply(statusChange(taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED, taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED, "user:alice", "", 0)))
	require.Equal(t, -1, (&progress{}).apply(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: "timeout"}}}),
		"the runner's failed is followed by the final status_change")
}

func statusChange(from, to taskrunnerv1.TaskStatus, actor, reason string, pos int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StatusChange{StatusChange: &taskrunnerv1.StatusChange{
		From: from, To: to, Actor: actor, Reason: reason, QueuePosition: pos}}}
}

func TestProgressShowsStatusQueueAndSandbox(t *testing.T) {
	p := &progress{}
	p.apply(statusChange(0, taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, "user:alice", "", 0))
	p.apply(statusChange(taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED, "dispatch", "repository at capacity", 3))
	p.apply(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_QueuePosition{QueuePosition: &taskrunnerv1.QueuePosition{Position: 2}}})
	var b strings.Builder
	p.render(&b, "t1")
	out := b.String()
	require.Contains(t, out, "status queued (#2 in the queue)")
	require.Contains(t, out, "· status created → proposing by user:alice")
	require.Contains(t, out, "· status proposing → queued (#3 in the queue) by dispatch: repository at capacity")
	require.Contains(t, out, "· queue  #2")

	p.apply(statusChange(taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, "dispatch", "", 0))
	p.apply(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Sandbox{Sandbox: &taskrunnerv1.SandboxState{State: "started", Provider: "process", SandboxId: "tr-1"}}})
	b.Reset()
	p.render(&b, "t1")
	require.Contains(t, b.String(), "status running\n")
	require.NotContains(t, b.String(), "status running (#")
	require.Contains(t, b.String(), "· sandbox started (process tr-1)")
}

func TestEventLines(t *testing.T) {
	for _, tc := range []struct {
		ev   *taskrunnerv1.Event
		want string
	}{
		{statusChange(taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, "reaper", "runner_lost", 0), "status running → failed by reaper: runner_lost"},
		{&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Sandbox{Sandbox: &taskrunnerv1.SandboxState{State: "failed", Provider: "docker", Reason: "no image"}}}, "sandbox failed (docker): no image"},
		{&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_QueuePosition{QueuePosition: &taskrunnerv1.QueuePosition{Position: 1}}}, "queue  #1"},
		{&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"a", "b"}}}}, "log    a\nlog    b"},
		{&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_APPLY}}}, "stage  apply"},
	} {
		require.Equal(t, tc.want, eventLine(tc.ev))
	}
	// Not a terminal: a buffer, and a regular file.
	require.False(t, isTerminal(&strings.Builder{}))
	f, err := os.CreateTemp(t.TempDir(), "out")
	require.NoError(t, err)
	defer f.Close()
	require.False(t, isTerminal(f))
}
