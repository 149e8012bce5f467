package dispatch

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/task"
)

// checkOwnerSpend refuses admission (ResourceExhausted, HTTP 429 with Retry-After until
// midnight UTC) once the owner's daily USD quota is spent: every run's model calls count
// (task.Tx.OwnerSpentToday). It runs under the admission lock.
func (s *Server) checkOwnerSpend(ctx context.Context, tx *task.Tx, owner string) error {
	if s.cfg.OwnerDailyUSD <= 0 {
		return nil
	}
	spent, resets, err := tx.OwnerSpentToday(ctx, owner)
	if err != nil {
		return err
	}
	if spent < s.cfg.OwnerDailyUSD {
		return nil
	}
	retry := max(int64(math.Ceil(time.Until(resets).Seconds())), 1)
	return errs.Quota(retry, "owner %q spent %.2f of the daily %.2f USD on model calls; retry in %d s (after 00:00 UTC)",
		owner, spent, s.cfg.OwnerDailyUSD, retry)
}

// isCredential keeps model keys and other credentials out of sandboxes even when an
// operator lists them in PassEnv: the model proxy holds the keys.
func isCredential(k string) bool {
	k = strings.ToUpper(k)
	for _, s := range []string{"API_KEY", "AUTH_TOKEN", "OAUTH", "SECRET", "PASSWORD", "PRIVATE_KEY", "ACCESS_KEY", "CREDENTIAL"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return strings.HasSuffix(k, "_TOKEN") || strings.HasSuffix(k, "_KEY")
}
