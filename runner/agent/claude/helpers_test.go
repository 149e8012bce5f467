package claude

import (
	"github.com/taskrunner/taskrunner/runner/agent"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

func reqFor(stage int) agent.StageRequest {
	return agent.StageRequest{Stage: taskrunnerv1.TaskStage(stage), Prompt: "p", Change: "c"}
}
