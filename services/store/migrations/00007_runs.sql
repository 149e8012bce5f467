-- +goose Up
-- A task has runs: the first, and one per follow-up (a new sandbox on the
-- same branch and pull request). tasks.run is the current (or last) run;
-- runner seqs count within a run (task_events.run), so a follow-up's runner
-- starts again at 1 while the timeline's seq goes on.
ALTER TABLE tasks ADD COLUMN run int NOT NULL DEFAULT 1;
ALTER TABLE task_events ADD COLUMN run int NOT NULL DEFAULT 1;

CREATE TABLE task_runs (
    task_id      uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    number       int NOT NULL CHECK (number > 0),
    trigger      text NOT NULL CHECK (trigger IN ('create', 'api', 'review', 'comment')),
    prompt       text NOT NULL DEFAULT '',
    state        text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'finished', 'failed')),
    requested_by text NOT NULL DEFAULT '',
    request_id   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    PRIMARY KEY (task_id, number)
);
-- Follow-ups are idempotent by request id (API Idempotency-Key, webhook delivery).
CREATE UNIQUE INDEX task_runs_request ON task_runs (task_id, request_id) WHERE request_id IS NOT NULL;
-- The owner's daily quota counts runs started (dispatches and follow-ups).
CREATE INDEX task_runs_started ON task_runs (started_at) WHERE started_at IS NOT NULL;
INSERT INTO task_runs (task_id, number, trigger, state, started_at)
SELECT id, 1, 'create', CASE WHEN status IN ('proposing', 'queued') THEN 'pending' WHEN status = 'running' THEN 'running'
    WHEN status = 'failed' THEN 'failed' ELSE 'finished' END, dispatched_at
FROM tasks;

-- One sandbox per run.
ALTER TABLE sandboxes ADD COLUMN run int NOT NULL DEFAULT 1;
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_pkey;
ALTER TABLE sandboxes ADD PRIMARY KEY (task_id, run);

-- The agent's session at the end of each run, restored into the next.
CREATE TABLE task_sessions (
    task_id    uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run        int NOT NULL,
    agent      text NOT NULL,
    session_id text NOT NULL,
    archive    bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, run)
);

-- +goose Down
DROP TABLE task_sessions;
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_pkey;
DELETE FROM sandboxes WHERE run > 1;
ALTER TABLE sandboxes ADD PRIMARY KEY (task_id);
ALTER TABLE sandboxes DROP COLUMN run;
DROP TABLE task_runs;
ALTER TABLE task_events DROP COLUMN run;
ALTER TABLE tasks DROP COLUMN run;
