package stages

import (
	"context"
	"errors"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/session"
)

// SessionStore keeps the agent's session between runs. *eventsclient.Client implements it
// (EventsService.SaveSession and LoadSession); both calls are bounded by their context.
type SessionStore interface {
	SaveSession(ctx context.Context, req *taskrunnerv1.SaveSessionRequest) error
	LoadSession(ctx context.Context) (*taskrunnerv1.LoadSessionResponse, error)
}

// restoreSession puts the previous run's session back into this sandbox and makes the agent
// resume it. Anything missing or broken only costs the continuity: the follow-up then starts
// cold, from the branch and the prompt alone.
func (r *run) restoreSession(ctx context.Context) {
	ag, ok := r.opts.Agent.(agent.Resumable)
	if !ok || r.opts.Sessions == nil {
		r.logf("no session store: the follow-up starts from the branch alone")
		return
	}
	lctx, cancel := context.WithTimeout(ctx, r.opts.SessionTimeout)
	defer cancel()
	resp, err := r.opts.Sessions.LoadSession(lctx)
	cold := func(why string, args ...any) {
		r.log.Warn("follow-up starts cold: "+why, args...)
		r.logf("the follow-up starts from the branch alone: %s", why)
	}
	switch {
	case err != nil:
		cold("the previous session could not be loaded", "err", err)
		return
	case !resp.GetFound():
		cold("no session was saved")
		return
	case resp.GetAgent() != ag.Name():
		cold("the saved session is " + resp.GetAgent() + "'s, this run uses " + ag.Name())
		return
	}
	m, files, err := session.Unpack(resp.GetArchive())
	if err != nil {
		cold("the saved session is unreadable", "err", err)
		return
	}
	if m.Session.ID == "" {
		m.Session.ID = resp.GetSessionId()
	}
	if err := session.Restore(files, m.Workspace, r.ws.Dir(), ag.RestorePath, r.ws.User()); err != nil {
		cold("the saved session could not be restored", "err", err)
		return
	}
	ag.Resume(m.Session)
	r.log.Info("session restored", "agent", ag.Name(), "session_id", m.Session.ID, "from_run", resp.GetRun(), "files", len(files))
	r.logf("resuming the %s conversation of run %d (session %s)", ag.Name(), resp.GetRun(), m.Session.ID)
}

// saveSession stores the agent's session for the next run: best effort (a failure is logged,
// never fails the run), bounded by SessionTimeout, and not bound to the run's context, which
// may have ended (a cancel or the deadline still leaves a conversation worth keeping).
func (r *run) saveSession() {
	ag, ok := r.opts.Agent.(agent.Resumable)
	if !ok || r.opts.Sessions == nil || r.stagesRun == 0 {
		return
	}
	s := ag.Session()
	if s.ID == "" {
		return
	}
	files, err := ag.SessionFiles()
	if err != nil {
		r.log.Warn("session not saved", "err", err)
		r.logf("warning: the agent session was not saved: %v", err)
		return
	}
	archive, err := session.Pack(session.Manifest{Agent: ag.Name(), Run: r.task.run(), Session: s, Workspace: r.ws.Dir()}, files, r.red, session.MaxBytes)
	if err != nil {
		if errors.Is(err, session.ErrTooLarge) {
			r.logf("warning: the agent session is over 8 MiB compressed and was not saved; the next run starts from the branch alone")
		} else {
			r.logf("warning: the agent session was not saved: %v", err)
		}
		r.log.Warn("session not saved", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.SessionTimeout)
	defer cancel()
	if err := r.opts.Sessions.SaveSession(ctx, &taskrunnerv1.SaveSessionRequest{
		Run: int32(r.task.run()), Agent: ag.Name(), SessionId: s.ID, Archive: archive,
	}); err != nil {
		r.log.Warn("session not saved", "err", err)
		r.logf("warning: the agent session was not saved: %v", err)
		return
	}
	r.log.Info("session saved", "agent", ag.Name(), "session_id", s.ID, "bytes", len(archive))
	r.logf("saved the %s conversation (%d bytes) for the next run", ag.Name(), len(archive))
}
