package proc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// User is the identity child processes run as; nil means the runner's own.
type User = syscall.Credential

// waitDelay bounds how long Wait waits for output pipes held open by stray descendants.
const waitDelay = 5 * time.Second

// Command builds a command that runs in its own process group as user (when not nil) with
// exactly env. When ctx ends, the whole process tree is killed.
func Command(ctx context.Context, user *User, dir string, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if user != nil {
		u := *user
		cmd.SysProcAttr.Credential = &u
	}
	cmd.Cancel = func() error {
		KillTree(cmd.Process.Pid)
		return nil
	}
	cmd.WaitDelay = waitDelay
	return cmd
}

// KillTree kills pid, its process group and every descendant found in /proc. Descendants are
// collected before anything is killed, since orphans are re-parented and lost from the tree.
func KillTree(pid int) {
	for range 3 {
		desc := descendants(pid)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for _, d := range desc {
			_ = syscall.Kill(d, syscall.SIGKILL)
		}
		if len(desc) == 0 {
			return
		}
	}
}

// descendants lists the transitive children of pid.
func descendants(pid int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// The command name may contain spaces and parentheses: fields start after the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		self, err2 := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err1 != nil || err2 != nil {
			continue
		}
		children[ppid] = append(children[ppid], self)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// Chown gives root and everything below it to user (no-op for a nil user).
func Chown(root string, user *User) error {
	if user == nil {
		return nil
	}
	return filepath.WalkDir(root, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(user.Uid), int(user.Gid))
	})
}
