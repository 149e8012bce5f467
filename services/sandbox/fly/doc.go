// Package fly runs each task's sandbox as one Fly Machine (public cloud)
// through the Machines API client in github.com/superfly/fly-go/flaps.
// Machines are launched with auto_destroy and restart policy "no", so a
// finished runner leaves nothing behind, and carry the taskrunner labels as
// machine metadata so the reaper can find them by a server-side filter. It
// must not keep state of its own and passes Spec.Env verbatim (never a
// GitHub token).
//
// Metadata keys: Fly's own keys are lower-case with underscores
// (fly_process_group, fly_platform_version); the rules for other
// characters are not documented, so labels are stored under keys with
// every character outside [a-z0-9_] replaced by "_"
// (taskrunner.task-id → taskrunner_task_id). The standard labels are
// mapped back when reading; other labels come back under their mapped key.
package fly
