package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// outcomeError carries the exit status of `task watch`.
type outcomeError struct {
	code int
	msg  string
}

func (e *outcomeError) Error() string { return e.msg }

var stageOrder = []taskrunnerv1.TaskStage{
	taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE, taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE,
	taskrunnerv1.TaskStage_TASK_STAGE_APPLY, taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE,
}

// progress is what `task watch` shows.
type progress struct {
	stage   taskrunnerv1.TaskStage
	diff    *taskrunnerv1.DiffStats
	usage   *taskrunnerv1.Usage
	logs    []string
	outcome string
}

// render draws the stage bar, diff stats, cost and the last log lines.
func (p *progress) render(w io.Writer, id string) {
	var steps []string
	for _, s := range stageOrder {
		mark := "·"
		switch {
		case p.stage == s && p.outcome == "":
			mark = "▶"
		case p.stage >= s:
			mark = "✓"
		}
		steps = append(steps, mark+" "+short(s.String(), "TASK_STAGE_"))
	}
	fmt.Fprintf(w, "task %s  %s\n", id, strings.Join(steps, "  →  "))
	if p.diff != nil {
		fmt.Fprintf(w, "  diff  +%d -%d in %d files\n", p.diff.GetAdditions(), p.diff.GetDeletions(), p.diff.GetFilesChanged())
	}
	if p.usage != nil {
		fmt.Fprintf(w, "  cost  $%.4f (%d in / %d out tokens)\n", p.usage.GetCostUsd(), p.usage.GetTokensIn(), p.usage.GetTokensOut())
	}
	for _, l := range p.logs {
		fmt.Fprintf(w, "  │ %s\n", clip(l, 110))
	}
	if p.outcome != "" {
		fmt.Fprintf(w, "  %s\n", p.outcome)
	}
}

// apply folds one event into the progress and reports the exit status once
// the task has ended (-1 while it runs).
func (p *progress) apply(ev *taskrunnerv1.Event) int {
	switch x := ev.GetPayload().(type) {
	case *taskrunnerv1.Event_StageChange:
		p.stage = x.StageChange.GetStage()
	case *taskrunnerv1.Event_Log:
		p.logs = append(p.logs, x.Log.GetLines()...)
		if len(p.logs) > 5 {
			p.logs = p.logs[len(p.logs)-5:]
		}
	case *taskrunnerv1.Event_DiffStats:
		p.diff = x.DiffStats
	case *taskrunnerv1.Event_Usage:
		p.usage = x.Usage
	case *taskrunnerv1.Event_Completed:
		p.outcome = "completed: " + x.Completed.GetPrUrl()
		return 0
	case *taskrunnerv1.Event_Failed:
		p.outcome = "failed: " + x.Failed.GetReason()
		return 1
	case *taskrunnerv1.Event_Cancelled:
		p.outcome = "cancelled: " + x.Cancelled.GetReason()
		return 2
	}
	return -1
}

func watchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "watch ID",
		Short: "Follow a task live: stages, diff stats, cost and the last log lines; exits 0 when it completes, 1 on failure, 2 when cancelled",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.token == "" {
				return errors.New("no API token: pass --token or set TASKRUNNER_TOKEN")
			}
			conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx := metadata.AppendToOutgoingContext(cmd.Context(), "authorization", "Bearer "+g.token)
			return watch(ctx, taskrunnerv1.NewEventsServiceClient(conn), taskrunnerv1.NewTaskServiceClient(conn), args[0], g)
		},
	}
}

func watch(ctx context.Context, ev taskrunnerv1.EventsServiceClient, tasks taskrunnerv1.TaskServiceClient, id string, g *globals) error {
	stream, err := ev.Subscribe(ctx, &taskrunnerv1.SubscribeRequest{TaskId: id})
	if err != nil {
		return err
	}
	p := &progress{}
	code := -1
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		code = p.apply(msg.GetEvent())
		if g.json {
			if err := writeProto(g.out, msg); err != nil {
				return err
			}
		} else {
			if _, ok := msg.GetEvent().GetPayload().(*taskrunnerv1.Event_Log); !ok || code >= 0 {
				p.render(g.out, id)
			}
		}
		if code >= 0 {
			break
		}
	}
	if code < 0 {
		// The stream ended without a terminal event (e.g. the reaper failed
		// the task): the task row has the outcome.
		t, err := tasks.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id})
		if err != nil {
			return err
		}
		switch t.GetTask().GetStatus() {
		case taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW, taskrunnerv1.TaskStatus_TASK_STATUS_DONE:
			code, p.outcome = 0, "completed: "+t.GetTask().GetPrUrl()
		case taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED:
			code, p.outcome = 2, "cancelled: "+t.GetTask().GetFailedReason()
		default:
			code, p.outcome = 1, "failed: "+t.GetTask().GetFailedReason()
		}
		if !g.json {
			p.render(g.out, id)
		}
	}
	if code != 0 {
		return &outcomeError{code: code, msg: p.outcome}
	}
	return nil
}
