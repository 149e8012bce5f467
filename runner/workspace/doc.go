// Package workspace is the task's git checkout: clone of the base branch, the task branch
// taskrunner/<task-id>, OpenSpec initialisation, diff stats against the base, commit and push.
// The repository token travels only as an HTTP Authorization header in the git process's
// environment (GIT_CONFIG_COUNT/KEY/VALUE), never in argv, a remote URL, a file or a log. Git
// runs as the agent user with the system and global configuration ignored and hooks disabled,
// and the repository configuration (which the agent can write) is replaced by a clean one
// before a push. It must not talk to the GitHub API.
package workspace
