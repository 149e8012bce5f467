-- +goose Up
-- taskrunner_events_expect runs once per committed batch. Its statements
-- take arrays, so PostgreSQL's plan cache kept choosing custom plans and
-- planned both statements again on every call: 30 % of the database's CPU
-- under sustained ingest (perf, make bench-sse). Their generic plans (index
-- probes by primary key, whatever the arrays hold) are the plans wanted.
ALTER FUNCTION taskrunner_events_expect(uuid[], timestamptz[], text[], text[], bigint[]) SET plan_cache_mode = force_generic_plan;

-- +goose Down
ALTER FUNCTION taskrunner_events_expect(uuid[], timestamptz[], text[], text[], bigint[]) RESET plan_cache_mode;
