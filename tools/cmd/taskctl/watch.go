package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

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
	status  taskrunnerv1.TaskStatus
	queue   int64 // position in the dispatch queue while queued
	diff    *taskrunnerv1.DiffStats
	usage   *taskrunnerv1.Usage
	logs    []string
	history []string // the last status, queue and sandbox lines
	outcome string
}

// statusLine describes a status_change: "queued → running by dispatch: capacity freed".
func statusLine(sc *taskrunnerv1.StatusChange) string {
	from := short(sc.GetFrom().String(), "TASK_STATUS_")
	if sc.GetFrom() == taskrunnerv1.TaskStatus_TASK_STATUS_UNSPECIFIED {
		from = "created"
	}
	s := "status " + from + " → " + short(sc.GetTo().String(), "TASK_STATUS_")
	if sc.GetTo() == taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED && sc.GetQueuePosition() > 0 {
		s += fmt.Sprintf(" (#%d in the queue)", sc.GetQueuePosition())
	}
	if sc.GetActor() != "" {
		s += " by " + sc.GetActor()
	}
	if sc.GetReason() != "" {
		s += ": " + sc.GetReason()
	}
	return s
}

// eventLine is one event as one line, for output that is not a terminal.
func eventLine(ev *taskrunnerv1.Event) string {
	switch x := ev.GetPayload().(type) {
	case *taskrunnerv1.Event_StatusChange:
		return statusLine(x.StatusChange)
	case *taskrunnerv1.Event_QueuePosition:
		return fmt.Sprintf("queue  #%d", x.QueuePosition.GetPosition())
	case *taskrunnerv1.Event_Sandbox:
		s := "sandbox " + x.Sandbox.GetState() + " (" + x.Sandbox.GetProvider()
		if x.Sandbox.GetSandboxId() != "" {
			s += " " + x.Sandbox.GetSandboxId()
		}
		s += ")"
		if x.Sandbox.GetReason() != "" {
			s += ": " + x.Sandbox.GetReason()
		}
		return s
	case *taskrunnerv1.Event_StageChange:
		return "stage  " + short(x.StageChange.GetStage().String(), "TASK_STAGE_")
	case *taskrunnerv1.Event_Log:
		var b strings.Builder
		for i, l := range x.Log.GetLines() {
			if i > 0 {
				b.WriteString("\n")
			}
			b.WriteString("log    " + l)
		}
		return b.String()
	case *taskrunnerv1.Event_DiffStats:
		d := x.DiffStats
		return fmt.Sprintf("diff   +%d -%d in %d files", d.GetAdditions(), d.GetDeletions(), d.GetFilesChanged())
	case *taskrunnerv1.Event_Usage:
		u := x.Usage
		return fmt.Sprintf("cost   $%.4f (%d in / %d out tokens)", u.GetCostUsd(), u.GetTokensIn(), u.GetTokensOut())
	case *taskrunnerv1.Event_Completed:
		return "runner completed: " + x.Completed.GetPrUrl()
	case *taskrunnerv1.Event_Failed:
		return "runner failed: " + x.Failed.GetReason()
	case *taskrunnerv1.Event_Cancelled:
		return "runner cancelled: " + x.Cancelled.GetReason()
	}
	return ""
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
	if p.status != taskrunnerv1.TaskStatus_TASK_STATUS_UNSPECIFIED {
		st := short(p.status.String(), "TASK_STATUS_")
		if p.status == taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED && p.queue > 0 {
			st += fmt.Sprintf(" (#%d in the queue)", p.queue)
		}
		fmt.Fprintf(w, "  status %s\n", st)
	}
	for _, h := range p.history {
		fmt.Fprintf(w, "  · %s\n", clip(h, 110))
	}
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
// the task has ended (-1 while it runs). The timeline ends with the
// status_change into done (0), failed (1) or cancelled (2); the runner's
// completed only means the pull request is open and awaits review.
func (p *progress) apply(ev *taskrunnerv1.Event) int {
	switch x := ev.GetPayload().(type) {
	case *taskrunnerv1.Event_StatusChange:
		sc := x.StatusChange
		p.status, p.queue = sc.GetTo(), sc.GetQueuePosition()
		p.remember(statusLine(sc))
		switch sc.GetTo() {
		case taskrunnerv1.TaskStatus_TASK_STATUS_DONE:
			p.outcome = "done: pull request merged"
			return 0
		case taskrunnerv1.TaskStatus_TASK_STATUS_FAILED:
			p.outcome = "failed: " + sc.GetReason()
			return 1
		case taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED:
			p.outcome = "cancelled: " + sc.GetReason()
			return 2
		}
	case *taskrunnerv1.Event_QueuePosition:
		p.queue = x.QueuePosition.GetPosition()
		p.remember(eventLine(ev))
	case *taskrunnerv1.Event_Sandbox:
		p.remember(eventLine(ev))
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
		p.remember("pull request opened: " + x.Completed.GetPrUrl() + " (awaiting review)")
	case *taskrunnerv1.Event_Failed:
		p.remember("runner failed: " + x.Failed.GetReason())
	case *taskrunnerv1.Event_Cancelled:
		p.remember("runner cancelled: " + x.Cancelled.GetReason())
	}
	return -1
}

// remember keeps the last few timeline lines.
func (p *progress) remember(line string) {
	p.history = append(p.history, line)
	if len(p.history) > 6 {
		p.history = p.history[len(p.history)-6:]
	}
}

// isTerminal reports whether w is a terminal, where `task watch` redraws
// its block in place; anywhere else (a pipe, a file, CI logs) it prints
// one line per event.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func watchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "watch ID",
		Short: "Follow a task live: stages, diff stats, cost and the last log lines; exits 0 when it completes, 1 on failure, 2 when cancelled",
		Example: `  taskctl task watch 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50
  taskctl task watch 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50 --json   # one JSON object per SubscribeResponse`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, ctx, err := g.conn(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
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
	tty := !g.json && isTerminal(g.out)
	drawn := 0 // lines of the block drawn last, erased before the next
	draw := func() {
		var b strings.Builder
		p.render(&b, id)
		if drawn > 0 {
			fmt.Fprintf(g.out, "\x1b[%dA\x1b[J", drawn) // cursor up, erase to the end
		}
		drawn = strings.Count(b.String(), "\n")
		_, _ = io.WriteString(g.out, b.String())
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		code = p.apply(msg.GetEvent())
		switch {
		case g.json:
			if err := writeProto(g.out, msg); err != nil {
				return err
			}
		case tty:
			draw()
		default:
			if l := eventLine(msg.GetEvent()); l != "" {
				fmt.Fprintf(g.out, "%d %s\n", msg.GetEvent().GetSeq(), l)
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
		switch {
		case tty:
			draw()
		case !g.json:
			fmt.Fprintln(g.out, p.outcome)
		}
	}
	if code != 0 {
		return &outcomeError{code: code, msg: p.outcome}
	}
	return nil
}
