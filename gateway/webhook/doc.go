// Package webhook receives GitHub webhooks at POST /v1/webhooks/github (ARCHITECTURE.md
// sections 2 and 3): it verifies X-Hub-Signature-256, and turns a closed pull request of a
// taskrunner branch (taskrunner/<task-id>) into a task transition through TaskService:
// merged → done, closed without merge → cancelled. The delivery id makes every transition
// idempotent, so a redelivered webhook changes nothing.
//
// It must not read the database or decide transitions itself: TaskService is the single
// authority, reached over gRPC through the Tasks interface. It must never log a request body,
// a signature or a credential.
package webhook
