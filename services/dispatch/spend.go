package dispatch

import (
	"context"
	"strings"

	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/task"
)

// ownerSpentToday is what an owner's tasks created since 00:00 UTC have spent (the model
// proxy keeps each task's cost_usd), and the seconds until the next 00:00 UTC. The
// database's clock decides, as it does for every other admission window.
const ownerSpentToday = `SELECT coalesce(sum(cost_usd), 0)::float8,
	ceil(extract(epoch FROM (date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day') - (now() AT TIME ZONE 'UTC')))::bigint
FROM tasks WHERE owner = $1 AND created_at >= (date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')`

// checkOwnerSpend refuses admission (ResourceExhausted, HTTP 429 with Retry-After until
// midnight UTC) once the owner's daily USD quota is spent. It runs under the admission lock.
func (s *Server) checkOwnerSpend(ctx context.Context, tx *task.Tx, owner string) error {
	if s.cfg.OwnerDailyUSD <= 0 {
		return nil
	}
	var spent float64
	var retry int64
	if err := tx.QueryRow(ctx, ownerSpentToday, owner).Scan(&spent, &retry); err != nil {
		return err
	}
	if spent < s.cfg.OwnerDailyUSD {
		return nil
	}
	retry = max(retry, 1)
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
