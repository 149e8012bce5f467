package forge

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-github/v62/github"
	"github.com/google/uuid"
)

type pendingDelivery struct {
	id     string
	event  string
	action string
	body   []byte
}

// sendPullRequestEvent queues a pull_request webhook.
func (f *Forge) sendPullRequestEvent(base, action string, rp *repo, pr PullRequest, sender string) {
	f.enqueue("pull_request", action, &github.PullRequestEvent{
		Action: github.String(action), Number: github.Int(pr.Number), PullRequest: f.renderPull(base, rp, pr),
		Repo: f.renderRepo(base, rp), Installation: webhookInstallation(rp), Sender: f.renderUser(base, sender),
	})
}

// sendReviewEvent queues a pull_request_review webhook ("submitted"). GitHub writes the review
// state in lower case in this payload ("changes_requested") and in upper case in REST answers
// ("CHANGES_REQUESTED"); the forge does the same, so receivers are tested against both.
func (f *Forge) sendReviewEvent(base string, rp *repo, pr PullRequest, rv Review) {
	review := f.renderReview(base, rp, rv)
	review.State = github.String(strings.ToLower(rv.State))
	f.enqueue("pull_request_review", "submitted", &github.PullRequestReviewEvent{
		Action: github.String("submitted"), Review: review, PullRequest: f.renderPull(base, rp, pr),
		Repo: f.renderRepo(base, rp), Installation: webhookInstallation(rp), Sender: f.renderUser(base, rv.User),
	})
}

// sendReviewCommentEvent queues a pull_request_review_comment webhook ("created").
func (f *Forge) sendReviewCommentEvent(base string, rp *repo, pr PullRequest, c ReviewComment) {
	f.enqueue("pull_request_review_comment", "created", &github.PullRequestReviewCommentEvent{
		Action: github.String("created"), Comment: f.renderReviewComment(base, rp, c), PullRequest: f.renderPull(base, rp, pr),
		Repo: f.renderRepo(base, rp), Installation: webhookInstallation(rp), Sender: f.renderUser(base, c.User),
	})
}

// sendIssueCommentEvent queues an issue_comment webhook ("created") for a pull request.
func (f *Forge) sendIssueCommentEvent(base string, rp *repo, pr PullRequest, c IssueComment) {
	f.enqueue("issue_comment", "created", &github.IssueCommentEvent{
		Action: github.String("created"), Issue: f.renderPullAsIssue(base, rp, pr), Comment: f.renderIssueComment(base, rp, c),
		Repo: f.renderRepo(base, rp), Installation: webhookInstallation(rp), Sender: f.renderUser(base, c.User),
	})
}

// enqueue queues a webhook. Deliveries go out one at a time, in the order they were queued,
// from a goroutine that exits when the queue is empty (Close waits for it).
func (f *Forge) enqueue(event, action string, payload any) {
	if f.cfg.WebhookURL == "" {
		return
	}
	body, err := json.Marshal(payload)
	if err != nil {
		f.log.Error("forge: webhook payload", "event", event, "err", err)
		return
	}
	d := pendingDelivery{id: uuid.NewString(), event: event, action: action, body: body}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.queue = append(f.queue, d)
	if !f.delivering {
		f.delivering = true
		f.wg.Add(1)
		go f.deliverLoop()
	}
}

func (f *Forge) deliverLoop() {
	defer f.wg.Done()
	for {
		f.mu.Lock()
		if len(f.queue) == 0 {
			f.delivering = false
			f.mu.Unlock()
			return
		}
		d := f.queue[0]
		f.queue = f.queue[1:]
		f.mu.Unlock()
		f.deliver(d)
	}
}

// Signature returns the X-Hub-Signature-256 value GitHub sends for body signed with secret.
func Signature(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

func (f *Forge) deliver(d pendingDelivery) {
	result := Delivery{ID: d.id, Event: d.event, Action: d.action}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.cfg.WebhookURL, bytes.NewReader(d.body))
	if err == nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("User-Agent", "GitHub-Hookshot/forge")
		req.Header.Set("X-GitHub-Event", d.event)
		req.Header.Set("X-GitHub-Delivery", d.id)
		req.Header.Set("X-GitHub-Hook-ID", "1")
		req.Header.Set("X-GitHub-Hook-Installation-Target-Type", "integration")
		req.Header.Set("X-GitHub-Hook-Installation-Target-ID", strconv.FormatInt(f.cfg.AppID, 10))
		req.Header.Set("X-Hub-Signature-256", Signature(f.cfg.WebhookSecret, d.body))
		var resp *http.Response
		resp, err = f.hookClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			_ = resp.Body.Close()
			result.StatusCode = resp.StatusCode
		}
	}
	if err != nil {
		result.Err = err.Error()
		f.log.Warn("forge: webhook delivery failed", "delivery", d.id, "event", d.event, "action", d.action, "err", err)
	} else {
		f.log.Info("forge: webhook delivered", "delivery", d.id, "event", d.event, "action", d.action, "status", result.StatusCode)
	}
	f.mu.Lock()
	f.deliveries = append(f.deliveries, result)
	f.mu.Unlock()
}
