-- +goose Up
-- When a task was admitted by Dispatch (quota window) and when it started.
ALTER TABLE tasks ADD COLUMN dispatched_at timestamptz;
ALTER TABLE tasks ADD COLUMN started_at timestamptz;
CREATE INDEX tasks_owner_dispatched ON tasks (owner, dispatched_at) WHERE dispatched_at IS NOT NULL;
CREATE INDEX tasks_queued_fifo ON tasks (queued_at, id) WHERE status = 'queued';
CREATE INDEX tasks_running_deadline ON tasks (deadline_at) WHERE status = 'running';

-- Capacity frees whenever a task leaves 'running': wake every Dispatch
-- replica (LISTEN taskrunner_capacity) so the oldest queued task that fits
-- starts promptly, without polling.
-- +goose StatementBegin
CREATE FUNCTION taskrunner_notify_capacity() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('taskrunner_capacity', NEW.id::text);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
-- +goose StatementEnd

CREATE TRIGGER tasks_capacity_freed
AFTER UPDATE OF status ON tasks
FOR EACH ROW
WHEN (OLD.status = 'running' AND NEW.status <> 'running')
EXECUTE FUNCTION taskrunner_notify_capacity();

-- +goose Down
DROP TRIGGER tasks_capacity_freed ON tasks;
DROP FUNCTION taskrunner_notify_capacity();
DROP INDEX tasks_running_deadline;
DROP INDEX tasks_queued_fifo;
DROP INDEX tasks_owner_dispatched;
ALTER TABLE tasks DROP COLUMN started_at;
ALTER TABLE tasks DROP COLUMN dispatched_at;
