#!/usr/bin/env bash
# make bench-committers: bench-events' committers sweep (-committers-sweep) on
# 1 core and on every core of this host, each time with a PostgreSQL and a
# Redis of its own pinned to the same cores as the benchmark (taskset), so
# "1 core" means the whole system on one core, not only the Go processes.
# The servers are throwaway (a temporary directory, free ports),
# with fsync and synchronous_commit on like any durable server, and stopped
# at exit. The shared PostgreSQL and Redis are not touched.
#
#   BENCH_BIN      the bench-events binary (default .dev/bin/bench-events)
#   BENCH_CPUSETS  the core sets, as taskset -c takes them (default "0 0-<n-1>")
#   BENCH_FLAGS    more flags for bench-events (e.g. -sweep-rounds 3)
#   BENCH_COMMITTERS  the counts (default 1,2,4)
set -euo pipefail

bin=$(realpath "${BENCH_BIN:-.dev/bin/bench-events}")
n=$(nproc)
cpusets=${BENCH_CPUSETS:-"0 0-$((n - 1))"}
counts=${BENCH_COMMITTERS:-1,2,4}
pgbin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)")
[ -x "$pgbin/initdb" ] || pgbin=$(dirname "$(command -v initdb)")
command -v redis-server >/dev/null && command -v taskset >/dev/null || { echo "bench-committers needs redis-server and taskset" >&2; exit 1; }
# free_port prints a port nothing listens on (others' benchmarks come and go).
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 20000))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}
pgport=$(free_port)
redisport=$(free_port)

work=$(mktemp -d /tmp/taskrunner-bench-committers.XXXXXX)
as_pg=()
if [ "$(id -u)" = 0 ]; then
	as_pg=(runuser -u postgres --) # initdb and postgres refuse to run as root
	chown postgres "$work"
fi
stop() {
	"${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -m fast -w stop >/dev/null 2>&1 || true
	redis-cli -p $redisport shutdown nosave >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap stop EXIT

"${as_pg[@]}" "$pgbin/initdb" -D "$work/pg" -U postgres --auth=trust -E UTF8 >/dev/null
for cpus in $cpusets; do
	echo "=== cores $cpus: PostgreSQL, Redis and bench-events pinned with taskset -c $cpus ==="
	taskset -c "$cpus" "${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
		-o "-p $pgport -k $work -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on" start >/dev/null
	taskset -c "$cpus" redis-server --port $redisport --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
		--logfile "$work/redis.log" --dir "$work" >/dev/null
	for _ in $(seq 50); do redis-cli -p $redisport ping >/dev/null 2>&1 && break; sleep 0.1; done
	redis-cli -p $redisport ping >/dev/null || { echo "the throwaway Redis did not start:" >&2; tail -3 "$work/redis.log" >&2; exit 1; }
	# The paced run's rate scales with the cores: 2,500 events/s per core
	# (5,000 on 2 cores, the latency goal's rate; one core cannot carry
	# 5,000 events/s to 200 SSE clients at all).
	cores=$(taskset -c "$cpus" nproc)
	TASKRUNNER_BENCH_DATABASE_URL="postgres://postgres@127.0.0.1:$pgport/postgres?sslmode=disable" \
		TASKRUNNER_BENCH_REDIS_URL="redis://127.0.0.1:$redisport/0" \
		taskset -c "$cpus" "$bin" -committers-sweep "$counts" -rate $((2500 * cores)) ${BENCH_FLAGS:-}
	"${as_pg[@]}" "$pgbin/pg_ctl" -D "$work/pg" -m fast -w stop >/dev/null
	redis-cli -p $redisport shutdown nosave >/dev/null 2>&1 || true
	echo
done
