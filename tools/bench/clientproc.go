package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// clientProc is the bench's client process (runners and SSE clients, out of
// the measured process), driven line by line over its stdin and stdout:
// the spec, lineReady, lineGo, lineDone, then its JSON result.
type clientProc struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stdin  io.WriteCloser
	rd     *bufio.Reader
	waited bool
}

// startClient starts argv; call stop (deferred) whatever happens.
func startClient(ctx context.Context, argv []string) (*clientProc, error) {
	cctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	p := &clientProc{cmd: cmd, cancel: cancel}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("bench: starting the client process: %w", err)
	}
	p.stdin, p.rd = stdin, bufio.NewReader(stdout)
	return p, nil
}

// stop kills the process unless result already waited for it.
func (p *clientProc) stop() {
	if !p.waited {
		p.cancel()
		_ = p.cmd.Wait()
	}
	p.cancel()
}

func (p *clientProc) say(line string) error { _, err := fmt.Fprintln(p.stdin, line); return err }

func (p *clientProc) expect(want string) error { return expectLine(p.rd, want) }

// result reads the client's JSON result into v, then lets it exit.
func (p *clientProc) result(v any) error {
	line, err := p.rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("bench: reading the client's result: %w", err)
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("bench: bad client result: %w", err)
	}
	_ = p.stdin.Close()
	p.waited = true
	if err := p.cmd.Wait(); err != nil {
		return fmt.Errorf("bench: the client process: %w", err)
	}
	return nil
}

func expectLine(rd *bufio.Reader, want string) error {
	got, err := rd.ReadString('\n')
	if err != nil || strings.TrimSpace(got) != want {
		if errors.Is(err, io.EOF) && got == "" {
			return fmt.Errorf("bench: the client process exited before saying %q; its error is above", want)
		}
		return fmt.Errorf("bench: the client process said %q, not %q (%v); its error is above", strings.TrimSpace(got), want, err)
	}
	return nil
}

// Millis formats d in milliseconds with one decimal, as the reports do.
func Millis(d time.Duration) string { return ms(d) }

// LoadAvg is the first three fields of /proc/loadavg ("unknown" without it).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// Host describes the machine the figures come from: its CPU model (the
// first "model name" of /proc/cpuinfo) and count. Absolute figures (events
// per second, CPU-seconds) differ between machines; the ratios measured in
// one run are what compare.
func Host() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs", model, runtime.NumCPU())
}

// Steal measures the share of the machine's CPU time that the hypervisor
// gave to others from Steal's call to the returned function's; a high share
// means the figures are low for reasons outside the run.
func Steal() func() string {
	a := readHostTimes()
	return func() string {
		b := readHostTimes()
		if a.total == 0 || b.total <= a.total {
			return "unknown"
		}
		return fmt.Sprintf("%.1f%%", hostShares(a, b).Steal)
	}
}
