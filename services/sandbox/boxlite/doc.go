// Package boxlite runs each task's sandbox as one BoxLite microVM ("box")
// through the REST API of `boxlite serve` on the same host, called with
// the providers' shared JSON client (sandbox/httpjson, which retries 429
// and idempotent 5xx answers). Box routes
// live under a path prefix that changed between BoxLite versions, so the
// provider discovers it from GET /v1/me (path_prefix, else prefix, else
// "default") instead of hard-coding one.
//
// BoxLite's create request has no labels (the server rejects unknown
// fields), so a box is found by its name, sandbox.Name(TaskID): the
// provider reports LabelManagedBy and LabelTaskID derived from the name
// (exact for task ids made of lower-case letters, digits and dashes, such
// as UUIDs) plus whatever labels the server returns. The owner and other
// Spec labels are not stored, and Spec.Deadline is not enforced by BoxLite:
// the reaper enforces it. The package holds no state besides the
// discovered prefix and passes Spec.Env verbatim (never a GitHub token).
package boxlite
