package webhook

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/google/go-github/v62/github"
)

// ReviewPrompt turns a submitted review and its comments into the prompt of a follow-up run:
// who reviewed and how, the review's body, then every comment with its file and line. ok is
// false when the review asks for nothing: an approval (whatever it says), or a review without
// any text.
func ReviewPrompt(review *github.PullRequestReview, comments []*github.PullRequestComment) (prompt string, ok bool) {
	var verb string
	switch strings.ToLower(review.GetState()) {
	case "changes_requested":
		verb = "requested changes on"
	case "commented":
		verb = "commented on"
	default:
		return "", false
	}
	body := strings.TrimSpace(review.GetBody())
	var notes []string
	for _, c := range comments {
		text := strings.TrimSpace(c.GetBody())
		if text == "" {
			continue
		}
		notes = append(notes, "- "+location(c)+":\n"+indent(text, "  "))
	}
	if body == "" && len(notes) == 0 {
		return "", false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s the pull request. Address the review on the same branch.\n", author(review.GetUser()), verb)
	if body != "" {
		b.WriteString("\nReview:\n" + indent(body, "  ") + "\n")
	}
	if len(notes) > 0 {
		b.WriteString("\nComments on the code:\n" + strings.Join(notes, "\n") + "\n")
	}
	return b.String(), true
}

// location is "path line N", "path lines N-M", or "path (whole file)", with the old side named.
func location(c *github.PullRequestComment) string {
	line, start := c.GetLine(), c.GetStartLine()
	if line == 0 { // outdated comments keep only their original place
		line, start = c.GetOriginalLine(), c.GetOriginalStartLine()
	}
	var at string
	switch {
	case line == 0:
		at = c.GetPath() + " (whole file)"
	case start > 0 && start < line:
		at = fmt.Sprintf("%s lines %d-%d", c.GetPath(), start, line)
	default:
		at = fmt.Sprintf("%s line %d", c.GetPath(), line)
	}
	if strings.EqualFold(c.GetSide(), "LEFT") {
		at += " (old version, before this pull request)"
	}
	return at
}

func author(u *github.User) string {
	if u.GetLogin() == "" {
		return "A reviewer"
	}
	return "@" + u.GetLogin()
}

func indent(s, prefix string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = prefix + strings.TrimRight(l, " \t\r")
		} else {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// CommentPrompt turns a comment on a pull request's conversation into the prompt of a
// follow-up run; ok is false when the comment does not mention handle (see Mentions).
func CommentPrompt(body, login, handle string) (prompt string, ok bool) {
	if !Mentions(body, handle) {
		return "", false
	}
	who := "Someone"
	if login != "" {
		who = "@" + login
	}
	return fmt.Sprintf("%s asked on the pull request:\n\n%s\n", who, indent(strings.TrimSpace(body), "  ")), true
}

var (
	inlineCode = regexp.MustCompile("`[^`]*`")
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
)

// Mentions reports whether text mentions handle (say "@taskrunner") the way GitHub links a
// mention: case-insensitively, not inside a longer name or an e-mail address, and not in a
// quoted line ("> ..."), a fenced code block or an inline code span, so that quoting an
// earlier request does not repeat it.
func Mentions(text, handle string) bool {
	if handle == "" {
		return false
	}
	re := regexp.MustCompile(`(?i)(?:^|[^A-Za-z0-9_@./-])` + regexp.QuoteMeta(handle) + `(?:$|[^A-Za-z0-9_-])`)
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence || strings.HasPrefix(strings.TrimSpace(line), ">") {
			continue
		}
		if re.MatchString(inlineCode.ReplaceAllString(line, "")) {
			return true
		}
	}
	return false
}
