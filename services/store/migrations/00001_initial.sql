-- +goose Up
CREATE TABLE api_tokens (
    id           uuid PRIMARY KEY,
    owner        text NOT NULL CHECK (owner <> ''),
    token_hash   bytea NOT NULL UNIQUE,
    scopes       text[] NOT NULL DEFAULT '{tasks}',
    description  text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

CREATE TABLE tasks (
    id              uuid PRIMARY KEY,
    owner           text NOT NULL,
    repo            text NOT NULL,
    base_branch     text NOT NULL,
    head_branch     text NOT NULL,
    prompt          text NOT NULL,
    agent           text NOT NULL DEFAULT 'claude',
    status          text NOT NULL CHECK (status IN ('proposing','queued','running','awaiting_review','done','failed','cancelled')),
    stage           text NOT NULL DEFAULT '' CHECK (stage IN ('','explore','propose','apply','archive')),
    additions       bigint NOT NULL DEFAULT 0,
    deletions       bigint NOT NULL DEFAULT 0,
    files_changed   bigint NOT NULL DEFAULT 0,
    pr_url          text NOT NULL DEFAULT '',
    pr_number       bigint NOT NULL DEFAULT 0,
    failed_reason   text NOT NULL DEFAULT '',
    cost_usd        double precision NOT NULL DEFAULT 0,
    tokens_in       bigint NOT NULL DEFAULT 0,
    tokens_out      bigint NOT NULL DEFAULT 0,
    deadline_at     timestamptz,
    last_seq        bigint NOT NULL DEFAULT 0,
    heartbeat_at    timestamptz,
    trace_id        text NOT NULL DEFAULT '',
    retry_of        uuid REFERENCES tasks (id),
    idempotency_key text,
    queued_at       timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- One task per (owner, idempotency key): concurrent creates with one key make one row.
CREATE UNIQUE INDEX tasks_owner_idempotency_key ON tasks (owner, idempotency_key) WHERE idempotency_key IS NOT NULL;
-- ListTasks: newest first per owner, optionally by status or repo.
CREATE INDEX tasks_owner_created ON tasks (owner, created_at DESC, id DESC);
CREATE INDEX tasks_owner_status_created ON tasks (owner, status, created_at DESC, id DESC);
-- Dispatch: running tasks per repository and the FIFO queue.
CREATE INDEX tasks_status_repo ON tasks (status, repo) WHERE status IN ('queued', 'running');
-- Webhook: find the task by its head branch.
CREATE INDEX tasks_repo_head_branch ON tasks (repo, head_branch);

CREATE TABLE task_events (
    task_id    uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq        bigint NOT NULL CHECK (seq > 0),
    type       text NOT NULL,
    payload    jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, seq)
);

CREATE TABLE sandboxes (
    task_id      uuid PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    provider     text NOT NULL,
    external_id  text NOT NULL DEFAULT '',
    state        text NOT NULL DEFAULT 'creating',
    created_at   timestamptz NOT NULL DEFAULT now(),
    destroyed_at timestamptz
);

-- Transitions that come from a request rather than an event (cancel, webhook
-- delivery, dispatch) are made idempotent by remembering their request id.
CREATE TABLE task_requests (
    task_id    uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    request_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, request_id)
);

-- +goose Down
DROP TABLE task_requests;
DROP TABLE sandboxes;
DROP TABLE task_events;
DROP TABLE tasks;
DROP TABLE api_tokens;
