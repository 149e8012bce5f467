// Package webhook receives GitHub webhooks at POST /v1/webhooks/github (ARCHITECTURE.md
// sections 2 and 3). It verifies X-Hub-Signature-256 and parses deliveries with go-github
// (ValidateSignature, ValidatePayloadFromBody, ParseWebHook and its event types), then:
//   - pull_request closed on a taskrunner branch (taskrunner/<task-id>) → a task transition
//     through TaskService: merged → done, closed without merge → cancelled;
//   - pull_request_review and issue_comment (mentioning the configured handle) by an author
//     with write permission → a follow-up prompt handed to the FollowUps hook (followup.go);
//     without that hook they are verified, parsed, logged and acknowledged.
//
// The delivery id (X-GitHub-Delivery) is the request id of every transition and follow-up,
// so a redelivered webhook changes nothing.
//
// It must not read the database or decide transitions itself: TaskService is the single
// authority, reached over gRPC through the Tasks interface. It holds no GitHub credentials:
// permissions and review comments come through the Permissions and PullRequests interfaces.
// It must never log a request body, a comment's text, a signature or a credential.
package webhook
