package modelproxy

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/taskrunner/taskrunner/runner/agent"
)

// ErrBudget is the cause of a stage stopped by the control plane's budget refusal.
var ErrBudget = errors.New("budget exceeded")

// Guard wraps an agent so that the control plane's budget refusal ends the stage at once
// (the CLI may otherwise retry or carry on without a model) with a limit error: the runner
// then saves the work so far in a draft PR and reports failed with a reason starting
// "budget".
// A Resumable agent stays Resumable.
func Guard(inner agent.Agent, f *Forwarder) agent.Agent {
	g := guard{inner: inner, f: f}
	if r, ok := inner.(agent.Resumable); ok {
		return resumableGuard{Resumable: r, g: g}
	}
	return g
}

// resumableGuard is Guard of a Resumable agent.
type resumableGuard struct {
	agent.Resumable
	g guard
}

func (r resumableGuard) RunStage(ctx context.Context, req agent.StageRequest, obs agent.Observer) (agent.Result, error) {
	return r.g.RunStage(ctx, req, obs)
}

type guard struct {
	inner agent.Agent
	f     *Forwarder
}

func (g guard) RunStage(ctx context.Context, req agent.StageRequest, obs agent.Observer) (agent.Result, error) {
	if err := g.refusal(); err != nil {
		return agent.Result{}, err
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-g.f.BudgetRefused():
			cancel(ErrBudget)
		case <-stop:
		}
	}()
	res, err := g.inner.RunStage(sctx, req, obs)
	if rerr := g.refusal(); rerr != nil {
		return res, rerr
	}
	return res, err
}

// refusal is the limit error once the budget was refused.
func (g guard) refusal() error {
	select {
	case <-g.f.BudgetRefused():
		reason := g.f.Reason()
		if !strings.HasPrefix(reason, "budget") {
			reason = "budget exceeded: " + reason
		}
		return &agent.Error{Reason: strings.TrimSuffix(reason, ": "), Limit: true}
	default:
		return nil
	}
}

// refusalMessage is the message of an error body in either API's shape.
func refusalMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return "the control plane refused the model call"
}
