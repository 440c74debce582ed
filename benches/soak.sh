#!/usr/bin/env bash
# Issue 17 "Long runs": a soak of three real `shoal serve` processes (release build) on loopback
# under 32 clients of mixed work for MINUTES minutes. Each client loops over: put a small file
# (4-64 KiB; one in twenty 1-6 MiB) under cluster:/soak (2 copies), get one it wrote, list its
# folder, stat, write a setting, and remove an old file, against the three nodes in turn.
# Reports p50/p99 per operation, errors (target 0), and for each process RSS, open file
# descriptors, cluster.redb size and log size after a one-minute warm-up, every minute and at
# the end (target: growth under 10 %), and the growth from minute SOAK_SETTLE_MIN (15) on, once
# the bounded tables are full.
# Usage: benches/soak.sh [MINUTES=30] [CLIENTS=32]
# SOAK_WRAP_N0="heaptrack -o /tmp/n0" runs node 0 under that command (a heap profile; its RSS
# and timings then say little).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release/shoal
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
minutes=${1:-30}
clients=${2:-32}
work=$(mktemp -d /tmp/shoal-soak-XXXX)
base=$((7900 + RANDOM % 50 * 3))
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for i in 0 1 2; do
  mkdir -p "$work/n$i" "$work/vol$i"
  wrap=""
  [ "$i" = 0 ] && wrap=${SOAK_WRAP_N0:-}
  SHOAL_LOG=info $wrap "$bin" serve --data "$work/n$i" --listen "127.0.0.1:$((base + i))" --name "soak-$i" \
    > "$work/n$i.log" 2>&1 &
  pids+=($!)
done
cli() { local i=$1; shift; "$bin" --data "$work/n$i" --api "http://127.0.0.1:$((base + i))" "$@"; }
for i in 0 1 2; do
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$((base + i))/healthz" > /dev/null 2>&1 && break; sleep 0.1; done
done
cli 0 cluster create --name soak > /dev/null
for i in 1 2; do
  token=$(cli 0 --json token new | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
  cli "$i" join "$token" > /dev/null
done
for i in 0 1 2; do cli "$i" volume add "$work/vol$i" > /dev/null; done
cli 0 policy set /soak 2 > /dev/null
for i in 0 1 2; do
  for _ in $(seq 200); do curl -fs "http://127.0.0.1:$((base + i))/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
done

python3 - "$work" "$base" "$minutes" "$clients" "${pids[@]}" <<'PY'
import http.client, json, os, random, statistics, sys, threading, time

work, base, minutes, clients = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
pids = [int(p) for p in sys.argv[5:]]
tokens = [open(f"{work}/n{i}/admin.token").read().strip() for i in range(3)]
lat = {}
errors = {}
lock = threading.Lock()
stop = time.time() + minutes * 60

def note(op, ms, ok, why=""):
    with lock:
        lat.setdefault(op, []).append(ms)
        if not ok:
            errors.setdefault(op, []).append(why)

def call(conns, i, method, path, body=None):
    for attempt in range(2):
        c = conns.get(i)
        if c is None:
            c = conns[i] = http.client.HTTPConnection("127.0.0.1", base + i, timeout=60)
        try:
            h = {"authorization": "Bearer " + tokens[i]}
            if body is not None:
                h["content-length"] = str(len(body))
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, data
        except (http.client.HTTPException, OSError):
            c.close()
            conns.pop(i, None)
            if attempt == 1:
                raise
    raise RuntimeError("unreachable")

def client(n):
    rnd = random.Random(n)
    conns = {}
    mine = []
    k = 0
    while time.time() < stop:
        i = (n + k) % 3
        k += 1
        size = rnd.randint(1, 6) << 20 if rnd.random() < 0.05 else rnd.randint(4, 64) << 10
        body = os.urandom(size)
        path = f"/soak/c{n}/f{k}.bin"
        for op, method, target, data, want in [
            ("put", "PUT", "/v1/files" + path, body, 200),
            ("get", "GET", "/v1/files" + path, None, 200),
            ("ls", "GET", f"/v1/meta/ls?path=/soak/c{n}", None, 200),
            ("stat", "GET", "/v1/meta/stat?path=" + path, None, 200),
            ("setting", "PUT", f"/v1/settings/soak.c{n}", json.dumps({"value": k}).encode(), 200),
        ]:
            t = time.time()
            try:
                s, out = call(conns, i, method, target, data)
                ok = s == want and (op != "get" or out == body)
                note(op, (time.time() - t) * 1000, ok, f"{s} {out[:120]!r}")
            except Exception as e:
                note(op, (time.time() - t) * 1000, False, repr(e))
        mine.append(path)
        if len(mine) > 20:
            old = mine.pop(0)
            t = time.time()
            try:
                s, out = call(conns, i, "DELETE", "/v1/files" + old)
                note("rm", (time.time() - t) * 1000, s == 200, f"{s} {out[:120]!r}")
            except Exception as e:
                note("rm", (time.time() - t) * 1000, False, repr(e))

def sample():
    out = []
    for i, pid in enumerate(pids):
        rss = 0
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        db = os.path.getsize(f"{work}/n{i}/cluster.redb") >> 20
        log = os.path.getsize(f"{work}/n{i}.log") >> 10
        out.append((rss, fds, db, log))
    return out

threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
for t in threads:
    t.start()
warm = min(60, minutes * 60 / 4)
time.sleep(warm)
with lock:
    for v in lat.values():
        v.clear()
    errors.clear()
first = sample()
series = [first]
while time.time() + 1 < stop:
    time.sleep(max(0.0, min(60.0, stop - time.time())))
    if time.time() + 1 < stop:
        series.append(sample())
for t in threads:
    t.join()
last = sample()

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] if v else 0

print(f"soak: {minutes:g} min after {warm:.0f} s warm-up, {clients} clients, 3 nodes")
print(f"{'op':8} {'count':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
for op in ["put", "get", "ls", "stat", "setting", "rm"]:
    v = lat.get(op, [])
    print(f"{op:8} {len(v):8} {pct(v, 0.5):8.1f} {pct(v, 0.99):8.1f} {len(errors.get(op, [])):7}")
for op, why in errors.items():
    print(f"  {op} errors, e.g.: {why[:3]}")
print(f"{'node':6} {'RSS MiB':>14} {'fds':>12} {'redb MiB':>12} {'log KiB':>14}")
for i, (a, b) in enumerate(zip(first, last)):
    cells = [f"{x} -> {y}" for x, y in zip(a, b)]
    print(f"n{i:<5} {cells[0]:>14} {cells[1]:>12} {cells[2]:>12} {cells[3]:>14}")
print("per minute, RSS MiB / redb MiB per node:")
for m, row in enumerate(series):
    print(f"  {m:3} min  " + "  ".join(f"{r[0]:5}/{r[2]:<4}" for r in row))
growth = max((b[0] - a[0]) / a[0] for a, b in zip(first, last) if a[0])
print(f"largest RSS growth after warm-up: {growth * 100:.1f} %")
# The bounded tables (log 10,000 entries, audit/history/events 10,000 each, the event ring, the
# nonces of the last 10 minutes, redb's 32 MiB cache) fill in the first minutes of a run this
# busy; growth once they are full is what stays (tombstones of removed files, kept 7 days).
settle = int(os.environ.get("SOAK_SETTLE_MIN", "15"))
if len(series) > settle:
    grown = max((b[0] - a[0]) / a[0] for a, b in zip(series[settle], last) if a[0])
    print(f"largest RSS growth from minute {settle} to the end: {grown * 100:.1f} %")
PY
