#!/usr/bin/env bash
# make bench-harness: relaybus and River side by side in the public
# Postgres-queue harness (github.com/hardbyte/postgresql-job-queue-benchmarking),
# without Docker or PyPI: Debian's Python packages, the harness unpacked and
# patched in a scratch directory, one throwaway PostgreSQL cluster for both
# systems, one harness run (River first, then relaybus), and the four BENCH
# lines read from its summary.json.
#
# Variables (defaults in brackets):
#   PGQB_GIT      the harness's git directory, fetched beforehand
#                 [/work/.mirror/hardbyte+postgresql-job-queue-benchmarking/repo];
#                 e.g. git clone --bare https://github.com/hardbyte/postgresql-job-queue-benchmarking
#   PGQB_COMMIT   the harness commit run [93677ca]
#   PGQB_WORK     scratch directory, replaced on every run [${TMPDIR:-/tmp}/relaybus-pgqb]
#   PGQB_RATE     offered jobs/s [200]        PGQB_WORKERS  worker count [16]
#   PGQB_WARMUP   warm-up phase [30s]         PGQB_CLEAN    measured phase [90s]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/pgqb
GITDIR=${PGQB_GIT:-/work/.mirror/hardbyte+postgresql-job-queue-benchmarking/repo}
COMMIT=${PGQB_COMMIT:-93677ca}
WORK=${PGQB_WORK:-${TMPDIR:-/tmp}/relaybus-pgqb}
RATE=${PGQB_RATE:-200}
WORKERS=${PGQB_WORKERS:-16}
WARMUP=${PGQB_WARMUP:-30s}
CLEAN=${PGQB_CLEAN:-90s}
PORT=15555 # the harness's fixed Postgres port

die() { echo "bench-harness: $*" >&2; exit 1; }

# 1. Debian's packages for the harness (idempotent).
pkgs=(python3-psycopg python3-numpy python3-matplotlib python3-pydantic)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
	SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
PY=/usr/bin/python3 # Debian's, whose packages these are (not a pyenv or venv one first on PATH)
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$PGBIN/initdb" ] || die "no PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)"

# 2. The harness, unpacked without its results/ and patched.
git --git-dir="$GITDIR" rev-parse --verify -q "$COMMIT^{commit}" >/dev/null ||
	die "harness commit $COMMIT not found in $GITDIR: fetch github.com/hardbyte/postgresql-job-queue-benchmarking there (git clone --bare) or set PGQB_GIT"
rm -rf "$WORK"
mkdir -p "$WORK/harness"
mapfile -t top < <(git --git-dir="$GITDIR" ls-tree --name-only "$COMMIT" | grep -vx results)
git --git-dir="$GITDIR" archive "$COMMIT" -- "${top[@]}" | tar -x -C "$WORK/harness"
(cd "$WORK/harness" && patch -s -p1 <"$HERE/harness-no-docker.patch" && patch -s -p1 <"$HERE/harness-relaybus.patch")

# 3. A throwaway cluster: the harness's postgres.conf, on localhost:15555.
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
	die "port $PORT is taken (another harness run?); the harness needs it"
fi
RUNAS=()
if [ "$(id -u)" = 0 ]; then RUNAS=(runuser -u postgres --); fi # initdb refuses root
PGDATA=$WORK/pgdata
mkdir -p "$PGDATA"
echo bench >"$WORK/pwfile"
[ "$(id -u)" = 0 ] && chown -R postgres: "$PGDATA" "$WORK/pwfile"
"${RUNAS[@]}" "$PGBIN/initdb" -D "$PGDATA" -U bench --pwfile="$WORK/pwfile" \
	--auth-local=trust --auth-host=scram-sha-256 >"$WORK/initdb.log"
{
	cat "$WORK/harness/postgres.conf"
	echo "listen_addresses = 'localhost'"
	echo "port = $PORT"
	echo "unix_socket_directories = '$PGDATA'"
} >>"$PGDATA/postgresql.conf"
stop_pg() { "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null 2>&1 || true; }
trap stop_pg EXIT
"${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w start >/dev/null
PGPASSWORD=bench "$PGBIN/psql" -q -h localhost -p $PORT -U bench -d postgres -v ON_ERROR_STOP=1 \
	-f "$WORK/harness/init-databases.sql" >/dev/null

# 4. One run: River, then relaybus, on that cluster.
cd "$WORK/harness"
BENCH_NO_DOCKER=1 RELAYBUS_SRC=$ROOT $PY bench.py run --systems river,relaybus \
	--producer-mode fixed --producer-rate "$RATE" --worker-count "$WORKERS" --replicas 1 \
	--phase "warmup=warmup:$WARMUP" --phase "clean=clean:$CLEAN" >"$WORK/harness.log" 2>&1 ||
	{ tail -40 "$WORK/harness.log" >&2; die "the harness failed; its log: $WORK/harness.log"; }

# 5. The figures: each system's median over the measured phase.
summary=$(ls -td results/*/ | head -1)summary.json
[ -f "$summary" ] || die "no summary.json under $WORK/harness/results"
echo "# harness $COMMIT, $RATE jobs/s offered, $WORKERS workers, phases warmup:$WARMUP clean:$CLEAN; medians of the clean phase's 5 s samples; $summary"
$PY - "$summary" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
for system in ("relaybus", "river"):
    m = s["systems"][system]["phases"]["clean"]["metrics"]
    print(f"BENCH harness_claim_p99_ms_{system} {m['claim_p99_ms']['median']:g} ms")
    print(f"BENCH harness_jobs_per_s_{system} {m['completion_rate']['median']:.1f} jobs/s")
EOF
