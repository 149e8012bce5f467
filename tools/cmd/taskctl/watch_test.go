package main

import (
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

	require.Equal(t, 0, p.apply(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Completed{Completed: &taskrunnerv1.Completed{PrUrl: "http://forge/pr/1"}}}))
	require.Equal(t, 1, (&progress{}).apply(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: "timeout"}}}))
	require.Equal(t, 2, (&progress{}).apply(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Cancelled{Cancelled: &taskrunnerv1.Cancelled{}}}))
}
