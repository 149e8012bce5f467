// Package console serves taskrunner's small web console: one HTML page,
// a stylesheet and a few vanilla JavaScript modules, embedded in the
// gateway binary (no build step, no CDN, works offline).
//
// The console is a client of the public API only: the REST routes of
// taskrunner_http.yaml with the user's bearer token, and the SSE stream
// GET /v1/tasks/{id}/events (authenticated with ?access_token= because a
// browser's EventSource cannot set headers). It holds no secrets of its
// own: the token the user signs in with stays in the browser's
// sessionStorage (or localStorage when "remember" is ticked).
//
// Routes (see Handler.Routes), all GET or HEAD:
//
//	/                    index.html
//	/console/<asset>     embedded stylesheet and JavaScript modules
//	/console/config.js   the server-side Config as an ES module (Jaeger URL …)
//	/console/api/tasks/{id}/trace
//	                     the task's trace as a waterfall (JSON), read from
//	                     the Jaeger v1 query API after GetTask with the
//	                     caller's bearer token (the owner check)
//
// They are mounted next to the API with rest.Options.Extra and never
// shadow /v1/, /healthz, /readyz or /openapi.json: "GET /{$}" matches the
// root path only. Navigation inside the console uses the URL fragment
// (#/tasks/<id>), so the server needs no catch-all route.
package console
