// Package sse serves a task's events to browsers as Server-Sent Events:
// GET /v1/tasks/{id}/events and the frontend's legacy path
// GET /v1/projects/{repo}/branches/{branch}/tasks/{id}/events.
//
// Each connection is owner-checked through TaskService.GetTask with the
// caller's bearer token, subscribes to the task's Redis channel through one
// shared subscription per gateway process (the hub), replays stored events
// after Last-Event-ID through EventsService.ListEvents, then streams live
// events, writing only strictly increasing sequence numbers and filling any
// gap from ListEvents: no gap, no duplicate.
//
// Authentication is the REST API's bearer token, from the Authorization
// header or, because a browser's EventSource cannot set headers, from the
// access_token query parameter (the header wins when both are present).
// Tokens in URLs can end up in proxy logs: clients that can set headers
// should. The replay starts after the Last-Event-ID header (what EventSource
// sends when it reconnects) or the last_event_id query parameter.
//
// It must not read PostgreSQL (the gateway has no database credentials),
// must not open a Redis connection per client, and must never let one slow
// client delay another: a client whose bounded queue fills is cut off and
// resumes by reconnecting with Last-Event-ID.
package sse
