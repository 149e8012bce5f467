package webhook

import (
	"testing"

	"github.com/google/go-github/v62/github"
	"github.com/stretchr/testify/require"
)

func TestReviewPrompt(t *testing.T) {
	alice := &github.User{Login: github.String("alice")}
	comment := func(path string, line, start int, side, body string) *github.PullRequestComment {
		c := &github.PullRequestComment{Path: github.String(path), Body: github.String(body)}
		if line > 0 {
			c.Line = github.Int(line)
		}
		if start > 0 {
			c.StartLine = github.Int(start)
		}
		if side != "" {
			c.Side = github.String(side)
		}
		return c
	}
	outdated := &github.PullRequestComment{Path: github.String("old.go"), OriginalLine: github.Int(4), Body: github.String("Still wrong.")}
	tests := []struct {
		name     string
		review   *github.PullRequestReview
		comments []*github.PullRequestComment
		want     string
		wantOK   bool
	}{
		{
			name:   "changes requested with body and comments (webhook state in lower case)",
			review: &github.PullRequestReview{User: alice, State: github.String("changes_requested"), Body: github.String("Please rename things.\n")},
			comments: []*github.PullRequestComment{
				comment("feature.txt", 1, 0, "RIGHT", "Say uno."),
				comment("pkg/a.go", 12, 10, "", "Split this\nfunction."),
				comment("gone.go", 3, 0, "LEFT", "Why was this removed?"),
			},
			want: "@alice requested changes on the pull request. Address the review on the same branch.\n" +
				"\nReview:\n  Please rename things.\n" +
				"\nComments on the code:\n" +
				"- feature.txt line 1:\n  Say uno.\n" +
				"- pkg/a.go lines 10-12:\n  Split this\n  function.\n" +
				"- gone.go line 3 (old version, before this pull request):\n  Why was this removed?\n",
			wantOK: true,
		},
		{
			name:     "a lone comment: COMMENTED (REST state in upper case), empty body",
			review:   &github.PullRequestReview{User: alice, State: github.String("COMMENTED")},
			comments: []*github.PullRequestComment{comment("main.go", 7, 0, "RIGHT", "  Typo.  ")},
			want:     "@alice commented on the pull request. Address the review on the same branch.\n\nComments on the code:\n- main.go line 7:\n  Typo.\n",
			wantOK:   true,
		},
		{
			name:     "a file comment and an outdated comment",
			review:   &github.PullRequestReview{State: github.String("commented"), Body: github.String("See below.")},
			comments: []*github.PullRequestComment{comment("README.md", 0, 0, "", "Rewrite it."), outdated},
			want: "A reviewer commented on the pull request. Address the review on the same branch.\n\nReview:\n  See below.\n" +
				"\nComments on the code:\n- README.md (whole file):\n  Rewrite it.\n- old.go line 4:\n  Still wrong.\n",
			wantOK: true,
		},
		{
			name:   "blank lines inside a body stay blank",
			review: &github.PullRequestReview{User: alice, State: github.String("commented"), Body: github.String("First.\n\n   \nSecond.")},
			want:   "@alice commented on the pull request. Address the review on the same branch.\n\nReview:\n  First.\n\n\n  Second.\n",
			wantOK: true,
		},
		{name: "approval with a body", review: &github.PullRequestReview{User: alice, State: github.String("approved"), Body: github.String("LGTM, maybe rename x")}},
		{name: "approval with comments", review: &github.PullRequestReview{User: alice, State: github.String("APPROVED")}, comments: []*github.PullRequestComment{comment("a.go", 1, 0, "", "nit")}},
		{name: "dismissed", review: &github.PullRequestReview{User: alice, State: github.String("dismissed"), Body: github.String("x")}},
		{name: "commented without any text", review: &github.PullRequestReview{User: alice, State: github.String("commented"), Body: github.String("  ")}, comments: []*github.PullRequestComment{comment("a.go", 1, 0, "", " ")}},
		{name: "no state", review: &github.PullRequestReview{User: alice, Body: github.String("x")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ReviewPrompt(tc.review, tc.comments)
			require.Equal(t, tc.wantOK, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestCommentPrompt(t *testing.T) {
	tests := []struct {
		name, body, login, handle string
		want                      string
		wantOK                    bool
	}{
		{"mention", "@taskrunner please add a test for the empty case", "bob", "@taskrunner",
			"@bob asked on the pull request:\n\n  @taskrunner please add a test for the empty case\n", true},
		{"mention in the middle, other case, punctuation", "Thanks! @TaskRunner, also fix the typo.\nAnd the docs.", "bob", "@taskrunner",
			"@bob asked on the pull request:\n\n  Thanks! @TaskRunner, also fix the typo.\n  And the docs.\n", true},
		{"configured handle", "@helper do it", "", "@helper", "Someone asked on the pull request:\n\n  @helper do it\n", true},
		{"in parentheses", "(cc @taskrunner)", "bob", "@taskrunner", "@bob asked on the pull request:\n\n  (cc @taskrunner)\n", true},
		{"no mention", "looks good to me", "bob", "@taskrunner", "", false},
		{"another handle", "@taskrunner-bot do it", "bob", "@taskrunner", "", false},
		{"longer name", "@taskrunners do it", "bob", "@taskrunner", "", false},
		{"e-mail address", "mail ops@taskrunner.dev", "bob", "@taskrunner", "", false},
		{"path", "see docs/@taskrunner", "bob", "@taskrunner", "", false},
		{"quoted", "> @taskrunner do X\nI agree with this.", "bob", "@taskrunner", "", false},
		{"fenced code", "```\n@taskrunner do X\n```\nthat is how you ask", "bob", "@taskrunner", "", false},
		{"inline code", "type `@taskrunner do X` to ask", "bob", "@taskrunner", "", false},
		{"after a fence", "```\ncode\n```\n@taskrunner now do X", "bob", "@taskrunner",
			"@bob asked on the pull request:\n\n  ```\n  code\n  ```\n  @taskrunner now do X\n", true},
		{"empty handle", "@taskrunner", "bob", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := CommentPrompt(tc.body, tc.login, tc.handle)
			require.Equal(t, tc.wantOK, ok)
			require.Equal(t, tc.want, got)
		})
	}
}
