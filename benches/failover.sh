#!/usr/bin/env bash
# Issue 18 "Failover": metadata leader failover on three real `shoal serve` processes (release
# build) on loopback. For each lease setting (the default 30 s, then 10 s: `meta.lease`, with
# `meta.lease_renew_every` a third of it), ROUNDS times: SIGKILL the leader, then time until both
# survivors name the same new leader and a setting written through one of them is answered as
# replicated; the killed node is restarted before the next round.
# Usage: benches/failover.sh [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SHOAL_BIN:-$PWD/target/release/shoal}
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
rounds=${1:-3}
work=$(mktemp -d /tmp/shoal-failover-XXXX)
base=$((8300 + RANDOM % 50 * 3))
trap 'pkill -f "$work" 2>/dev/null || true; sleep 0.5; rm -rf "$work"' EXIT
start() {
  SHOAL_LOG=warn "$bin" serve --data "$work/n$1" --listen "127.0.0.1:$((base + $1))" > "$work/n$1.log" 2>&1 &
  echo $! > "$work/n$1.pid"
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$((base + $1))/healthz" > /dev/null 2>&1 && break; sleep 0.1; done
}
for i in 0 1 2; do mkdir -p "$work/n$i"; start $i; done
cli() { local i=$1; shift; "$bin" --data "$work/n$i" --api "http://127.0.0.1:$((base + i))" "$@"; }
cli 0 cluster create --name failover > /dev/null
for i in 1 2; do
  token=$(cli 0 --json token new | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
  cli "$i" join "$token" > /dev/null
done
export -f start
export work base bin
python3 - "$work" "$base" "$rounds" "$bin" <<'PY'
import http.client, json, os, signal, subprocess, sys, time
work, base, rounds, binary = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tokens = [open(f"{work}/n{i}/admin.token").read().strip() for i in range(3)]

def call(i, method, path, body=None):
    try:
        c = http.client.HTTPConnection("127.0.0.1", base + i, timeout=5)
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data, headers={"authorization": "Bearer " + tokens[i], "content-type": "application/json"})
        r = c.getresponse()
        out = r.read()
        return r.status, r.getheader("x-shoal-ack", ""), json.loads(out or b"null")
    except Exception:
        return 0, "", None

def ids():
    return [call(i, "GET", "/v1/cluster/status")[2]["node"] for i in range(3)]

def leader(i):
    s, _, v = call(i, "GET", "/v1/meta/status")
    return v.get("leader") if s == 200 and v else None

def start(i):
    subprocess.run(["bash", "-c", f"start {i}"], check=True)

def wait_ready():
    for _ in range(1200):
        if all(call(i, "GET", "/readyz")[0] == 200 for i in range(3)):
            return
        time.sleep(0.1)
    raise SystemExit("not ready")

node_ids = ids()
print(f"{'meta.lease':>10} {'round':>5} {'failover s':>10}")
for lease_s in [30, 10]:
    for key, value in [("meta.lease", f"{lease_s}s"), ("meta.lease_renew_every", f"{max(1, lease_s // 3)}s"),
                       ("meta.lease_check_every", f"{max(1, lease_s // 6)}s")]:
        s, _, v = call(0, "POST", "/v1/config", {"action": "set", "key": key, "value": value, "why": "failover bench"})
        assert s == 200, v
    time.sleep(6)  # the config pass applies it everywhere
    wait_ready()
    times = []
    for r in range(rounds):
        wait_ready()
        lead = leader(0)
        li = node_ids.index(lead)
        pid = int(open(f"{work}/n{li}.pid").read())
        survivors = [i for i in range(3) if i != li]
        t0 = time.time()
        os.kill(pid, signal.SIGKILL)
        while True:
            ls = [leader(i) for i in survivors]
            if ls[0] and ls[0] != lead and ls[0] == ls[1]:
                s, ack, _ = call(survivors[0], "PUT", f"/v1/settings/failover.{lease_s}.{r}", {"value": r})
                if s == 200 and ack == "replicated":
                    break
            time.sleep(0.05)
        took = time.time() - t0
        times.append(took)
        print(f"{lease_s:>9}s {r:>5} {took:>10.1f}")
        start(li)
    print(f"{lease_s:>9}s  mean {sum(times) / len(times):>8.1f}")
PY
