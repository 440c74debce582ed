#!/usr/bin/env bash
# Issue 16 "Speed": three real `shoal serve` processes (release build) on loopback; n2 is
# behind NAT (`--advertise none --tunnel-via n1`), so n0 reaches it only through a relay by n1.
# - A get of SIZE_MIB whose only copy is on n2, asked of n0 (relay: n0 -> n1 -> tunnel -> n2),
#   side by side with the same size whose only copy is on n0, asked of n1 (direct: n1 -> n0);
#   ROUNDS each, alternating, best and median.
# - Signed pings (`/v1/nodes/{id}/probe`) from n1 to n2 (over the tunnel n1 hosts) and from n1
#   to n0 (direct), 200 each: p50 and p99, and the added latency of the tunnel.
# Usage: benches/tunnel.sh [SIZE_MIB=256] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SHOAL_BIN:-$PWD/target/release/shoal}
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
size=${1:-256}
rounds=${2:-3}
work=$(mktemp -d /tmp/shoal-tunnel-XXXX)
base=$((8500 + RANDOM % 50 * 3))
trap 'pkill -f "$work" 2>/dev/null || true; sleep 0.5; rm -rf "$work"' EXIT
start() {
  local i=$1; shift
  SHOAL_LOG=warn "$bin" serve --data "$work/n$i" --listen "127.0.0.1:$((base + i))" "$@" > "$work/n$i.log" 2>&1 &
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$((base + i))/healthz" > /dev/null 2>&1 && break; sleep 0.1; done
}
cli() { local i=$1; shift; "$bin" --data "$work/n$i" --api "http://127.0.0.1:$((base + i))" "$@"; }
token() { cli 0 --json token new | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])'; }
id_of() { cli "$1" --json cluster status | python3 -c 'import json,sys; print(json.load(sys.stdin)["node"])'; }
for i in 0 1 2; do mkdir -p "$work/n$i" "$work/vol$i"; done
start 0
start 1
cli 0 cluster create --name tunnel > /dev/null
cli 1 join "$(token)" > /dev/null
host=$(id_of 1)
start 2 --advertise none --tunnel-via "$host"
cli 2 join "$(token)" > /dev/null
nat=$(id_of 2)
direct=$(id_of 0)
for i in 0 2; do cli "$i" volume add "$work/vol$i" > /dev/null; done
for _ in $(seq 300); do
  up=$(cli 2 --json node tunnel | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  vols=$(cli 1 --json volume list | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["volumes"]))')
  [ "$up" = up ] && [ "$vols" = 2 ] && break
  sleep 0.2
done
head -c $((size << 20)) /dev/urandom > "$work/file.bin"
cli 2 put "$work/file.bin" cluster:/nat.bin > /dev/null     # its only copy lands on n2
cli 0 put "$work/file.bin" cluster:/direct.bin > /dev/null  # its only copy lands on n0
python3 - "$work" "$base" "$size" "$rounds" "$nat" "$direct" <<'PY'
import http.client, json, statistics, sys, time
work, base, size, rounds, nat, direct = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
tokens = [open(f"{work}/n{i}/admin.token").read().strip() for i in range(3)]

def get(i, path):
    c = http.client.HTTPConnection("127.0.0.1", base + i, timeout=600)
    t = time.time()
    c.request("GET", "/v1/files" + path, headers={"authorization": "Bearer " + tokens[i]})
    r = c.getresponse()
    n = 0
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        n += len(b)
    assert r.status == 200 and n == size << 20, (r.status, n)
    return time.time() - t

def probe(i, to):
    c = http.client.HTTPConnection("127.0.0.1", base + i, timeout=30)
    c.request("POST", f"/v1/nodes/{to}/probe", headers={"authorization": "Bearer " + tokens[i]})
    v = json.loads(c.getresponse().read())
    assert v.get("reachable"), v
    return v["rttMs"]

relay, plain = [], []
for _ in range(rounds):
    plain.append(get(1, "/direct.bin"))
    relay.append(get(0, "/nat.bin"))
mib = lambda ts: size / min(ts)
print(f"get {size} MiB, {rounds} rounds each (best, median MiB/s):")
print(f"  direct (n1 <- n0):             {mib(plain):7.1f}  {size / statistics.median(plain):7.1f}")
print(f"  relay  (n0 <- n1 <- tunnel n2): {mib(relay):7.1f}  {size / statistics.median(relay):7.1f}")
print(f"  relay / direct (medians): {statistics.median(plain) / statistics.median(relay) * 100:.0f} %")
for _ in range(20):
    probe(1, nat), probe(1, direct)
tun, dire = [], []
for _ in range(200):
    tun.append(probe(1, nat))
    dire.append(probe(1, direct))
pct = lambda v, p: sorted(v)[min(len(v) - 1, int(len(v) * p))]
print("signed ping from n1, 200 each (p50 / p99 ms):")
print(f"  direct to n0:           {pct(dire, .5):6.3f} / {pct(dire, .99):6.3f}")
print(f"  through the tunnel, n2: {pct(tun, .5):6.3f} / {pct(tun, .99):6.3f}")
print(f"  added by the tunnel (p50): {pct(tun, .5) - pct(dire, .5):+.3f} ms")
PY
