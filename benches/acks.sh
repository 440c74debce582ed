#!/usr/bin/env bash
# Issue 18 "Acknowledged means safe": metadata writes per second under each `meta.ack` mode,
# side by side in one run on three real `shoal serve` processes (release build) on loopback:
# N setting writes (PUT /v1/settings/KEY, each answered as the mode says) from one client, then
# from 16 concurrent clients, through a follower, on keep-alive connections. Reports writes/s,
# p50/p99 and what the answers reached (`x-shoal-ack`). When `etcd` is installed
# (`apt-get install etcd-server`), the same client then does the same puts into etcd (3 members
# on loopback, its JSON gateway `POST /v3/kv/put`, through a follower: etcd fsyncs and waits for
# a majority).
# Usage: benches/acks.sh [N=10000]   (MODES="replicated durable" and CLIENTS="16" run only those; ETCD=0 skips etcd)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SHOAL_BIN:-$PWD/target/release/shoal}
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
n=${1:-10000}
work=$(mktemp -d /tmp/shoal-acks-XXXX)
base=$((8100 + RANDOM % 50 * 3))
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for i in 0 1 2; do
  mkdir -p "$work/n$i"
  SHOAL_LOG=warn "$bin" serve --data "$work/n$i" --listen "127.0.0.1:$((base + i))" > "$work/n$i.log" 2>&1 &
  pids+=($!)
done
cli() { local i=$1; shift; "$bin" --data "$work/n$i" --api "http://127.0.0.1:$((base + i))" "$@"; }
for i in 0 1 2; do
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$((base + i))/healthz" > /dev/null 2>&1 && break; sleep 0.1; done
done
cli 0 cluster create --name acks > /dev/null
for i in 1 2; do
  token=$(cli 0 --json token new | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
  cli "$i" join "$token" > /dev/null
done
for i in 0 1 2; do
  for _ in $(seq 300); do curl -fs "http://127.0.0.1:$((base + i))/readyz" > /dev/null 2>&1 && break; sleep 0.1; done
done

MODES=${MODES:-local replicated durable} CLIENTS=${CLIENTS:-1 16} python3 - "$work" "$base" "$n" <<'PY'
import http.client, json, os, statistics, sys, threading, time
work, base, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tokens = [open(f"{work}/n{i}/admin.token").read().strip() for i in range(3)]

def conn(i):
    return http.client.HTTPConnection("127.0.0.1", base + i, timeout=60)

def put(c, i, key, value):
    body = json.dumps({"value": value}).encode()
    c.request("PUT", f"/v1/settings/{key}", body=body,
              headers={"authorization": "Bearer " + tokens[i], "content-type": "application/json"})
    r = c.getresponse()
    r.read()
    return r.status, r.getheader("x-shoal-ack", "")

def follower():
    c = conn(0)
    c.request("GET", "/v1/meta/status", headers={"authorization": "Bearer " + tokens[0]})
    leader = json.loads(c.getresponse().read())["leader"]
    for i in range(3):
        c = conn(i)
        c.request("GET", "/v1/cluster/status", headers={"authorization": "Bearer " + tokens[i]})
        if json.loads(c.getresponse().read())["node"] != leader:
            return i
    return 1

def set_mode(mode, at):
    c = conn(0)
    body = json.dumps({"action": "set", "key": "meta.ack", "value": mode, "why": "bench"}).encode()
    c.request("POST", "/v1/config", body=body, headers={"authorization": "Bearer " + tokens[0], "content-type": "application/json"})
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
    c = conn(at)
    for _ in range(200):
        s, ack = put(c, at, "bench.probe", 0)
        if ack == mode:
            return
        time.sleep(0.1)
    raise SystemExit(f"mode {mode} not applied")

def run(mode, clients, at):
    per = n // clients
    lat, acks, errors = [], {}, [0]
    lock = threading.Lock()
    def client(k):
        c = conn(at)
        mine = []
        for j in range(per):
            t = time.perf_counter()
            s, ack = put(c, at, f"bench.{mode}.{clients}.{k}.{j}", j)
            mine.append((time.perf_counter() - t) * 1000)
            with lock:
                acks[ack] = acks.get(ack, 0) + 1
                if s != 200:
                    errors[0] += 1
        with lock:
            lat.extend(mine)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads: t.start()
    for t in threads: t.join()
    secs = time.perf_counter() - t0
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(len(lat) * q))]
    print(f"{mode:10} {clients:7} {per * clients / secs:10.0f} {p(0.5):8.2f} {p(0.99):8.2f} {errors[0]:6}  {acks}")

at = follower()
print(f"{n} writes per row through a follower (node {at}) of 3")
print(f"{'meta.ack':10} {'clients':>7} {'writes/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}  answers")
for mode in os.environ["MODES"].split():
    set_mode(mode, at)
    for clients in map(int, os.environ["CLIENTS"].split()):
        run(mode, clients, at)
PY

[ "${ETCD:-1}" = 0 ] && exit 0
command -v etcd > /dev/null || { echo "etcd: not installed (apt-get install etcd-server), skipped"; exit 0; }
ebase=$((base + 20))
cluster=""
for i in 0 1 2; do cluster="$cluster${cluster:+,}m$i=http://127.0.0.1:$((ebase + 10 + i))"; done
for i in 0 1 2; do
  etcd --name "m$i" --data-dir "$work/etcd-$i" \
    --listen-peer-urls "http://127.0.0.1:$((ebase + 10 + i))" --initial-advertise-peer-urls "http://127.0.0.1:$((ebase + 10 + i))" \
    --listen-client-urls "http://127.0.0.1:$((ebase + i))" --advertise-client-urls "http://127.0.0.1:$((ebase + i))" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token shoal-acks --log-level error \
    > "$work/etcd-$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 300); do curl -fs "http://127.0.0.1:$((ebase + i))/health" > /dev/null 2>&1 && break; sleep 0.1; done
done
python3 - "$ebase" "$n" <<'PY'
import base64, http.client, json, sys, threading, time
base, n = int(sys.argv[1]), int(sys.argv[2])
def conn(i):
    return http.client.HTTPConnection("127.0.0.1", base + i, timeout=60)
c = conn(0)
c.request("POST", "/v3/maintenance/status", body=b"{}")
st = json.loads(c.getresponse().read())
leader = st["leader"]
at = 0
for i in range(3):
    c = conn(i)
    c.request("POST", "/v3/maintenance/status", body=b"{}")
    if json.loads(c.getresponse().read())["header"]["member_id"] != leader:
        at = i
        break
b64 = lambda s: base64.b64encode(s.encode()).decode()
def run(clients):
    per = n // clients
    lat, errors = [], [0]
    lock = threading.Lock()
    def client(k):
        c = conn(at)
        mine = []
        for j in range(per):
            body = json.dumps({"key": b64(f"bench.{clients}.{k}.{j}"), "value": b64(str(j))}).encode()
            t = time.perf_counter()
            c.request("POST", "/v3/kv/put", body=body)
            r = c.getresponse(); r.read()
            mine.append((time.perf_counter() - t) * 1000)
            if r.status != 200:
                with lock: errors[0] += 1
        with lock: lat.extend(mine)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads: t.start()
    for t in threads: t.join()
    secs = time.perf_counter() - t0
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(len(lat) * q))]
    print(f"{'etcd 3.4':10} {clients:7} {per * clients / secs:10.0f} {p(0.5):8.2f} {p(0.99):8.2f} {errors[0]:6}  (fsync + majority)")
for clients in [1, 16]:
    run(clients)
PY
