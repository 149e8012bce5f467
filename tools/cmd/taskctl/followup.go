package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// followupCmd asks for a follow-up run of a task awaiting review (or failed
// with a pull request): POST /v1/tasks/{id}:followup over gRPC.
func followupCmd(g *globals) *cobra.Command {
	var prompt, requestID string
	cmd := &cobra.Command{
		Use:   "followup ID --prompt TEXT",
		Short: "Ask the agent to revise a task's pull request (a new run on the same branch)",
		Long: `Records a follow-up run of a task that awaits review (or failed with a pull
request) and starts it when no run of the task is active. The run works on the
same branch and pull request and resumes the agent's saved session. With the
same --request-id, a repeated call records nothing new.`,
		Example: `  taskctl task followup 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50 --prompt "Also document the --farewell flag in the README"
  taskctl task followup 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50 --prompt "$(cat review.md)" --request-id review-2
  taskctl task followup 0b7c6a4e-5a1f-4b8e-9a57-4f1c2d3e4f50 --prompt "Rename it" --json   # {"task", "run", "created"}, as POST /v1/tasks/{id}:followup`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(prompt) == "" {
				return errors.New("--prompt: say what the follow-up should change")
			}
			c, ctx, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.FollowUpTask(ctx, &taskrunnerv1.FollowUpTaskRequest{Id: args[0], Prompt: prompt, RequestId: requestID})
			if err != nil {
				return err
			}
			if g.json {
				return writeProto(g.out, resp)
			}
			r := resp.GetRun()
			what := "recorded"
			if !resp.GetCreated() {
				what = "already recorded (same request id)"
			}
			fmt.Fprintf(g.out, "run %d %s: %s\n", r.GetNumber(), what, r.GetState())
			return g.printTask(resp, resp.GetTask())
		},
	}
	cmd.Flags().StringVar(&prompt, "prompt", "", "what the follow-up should change")
	cmd.Flags().StringVar(&requestID, "request-id", "", "idempotency key")
	return cmd
}

// printRuns lists a task's runs under its details (only when it has more than one).
func printRuns(row func(k, v string), t *taskrunnerv1.Task) {
	if len(t.GetRuns()) < 2 {
		return
	}
	for _, r := range t.GetRuns() {
		line := fmt.Sprintf("%s, %s", r.GetState(), r.GetTrigger())
		if d := r.GetDiffStats(); d.GetFilesChanged() > 0 {
			line += fmt.Sprintf(", +%d -%d in %d files", d.GetAdditions(), d.GetDeletions(), d.GetFilesChanged())
		}
		if u := r.GetUsage(); u.GetCostUsd() > 0 {
			line += fmt.Sprintf(", $%.4f", u.GetCostUsd())
		}
		if p := r.GetPrompt(); p != "" {
			line += ": " + clip(p, 60)
		}
		row(fmt.Sprintf("run %d", r.GetNumber()), line)
	}
}
