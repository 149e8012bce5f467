package claude

import (
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/agent"
)

func reqFor(stage int) agent.StageRequest {
	return agent.StageRequest{Stage: taskrunnerv1.TaskStage(stage), Prompt: "p", Change: "c"}
}
