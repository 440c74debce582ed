#!/usr/bin/env bash
# Issue 14 speed figures on a 3-node loopback demo (release build), side by side in one run:
#  1. word count map/reduce (examples/jobs/wordcount.js) over SIZE_MIB of text spread over the
#     three nodes, against `cat | tr -cs A-Za-z '\n' | sort | uniq -c` on the same files here;
#     the two counts are compared.
#  2. submit to running: N hello.js jobs submitted one after another through the three nodes; each job's
#     `started - created` (both stamped by the cluster, same machine clock), p50 and p90.
# Usage: benches/jobs_wordcount.sh [SIZE_MIB=256] [FILES=64] [N=100]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release/shoal
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
size_mib=${1:-256}
files=${2:-64}
n=${3:-100}
work=$(mktemp -d /tmp/shoal-wc-XXXX)
port=$((7700 + RANDOM % 200))
trap 'kill $demo 2>/dev/null; wait $demo 2>/dev/null; rm -rf "$work"' EXIT

# The text: words drawn from a 20,000-word vocabulary with a skewed distribution.
python3 - "$work/in" "$size_mib" "$files" <<'PY'
import os, random, sys
out, size_mib, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out, exist_ok=True)
rnd = random.Random(14)
letters = "abcdefghijklmnopqrstuvwxyz"
vocab = ["".join(rnd.choice(letters) for _ in range(rnd.randint(2, 10))) for _ in range(20000)]
weights = [1.0 / (i + 1) for i in range(len(vocab))]
per_file = size_mib * 1024 * 1024 // files
for f in range(files):
    words = rnd.choices(vocab, weights, k=per_file // 6 + 1000)
    text = (" ".join(words) + "\n").encode()
    lines = bytearray()
    for i in range(0, len(text), 80):
        lines += text[i:i + 80] + b"\n"
    body = bytes(lines[:per_file])
    body = body[:body.rfind(b"\n") + 1]  # whole lines only: `cat` must not join two files' words
    open(f"{out}/part-{f:03}.txt", "wb").write(body)
PY

SHOAL_LOG=warn "$bin" demo --nodes 3 --base-port "$port" > "$work/demo.log" 2>&1 &
demo=$!
for _ in $(seq 120); do grep -q "Ctrl-C" "$work/demo.log" 2>/dev/null && break; sleep 0.5; done
root=$(sed -n 's/.*data \(\/tmp\/shoal-demo-[^ ]*\)\/node-0$/\1/p' "$work/demo.log" | head -1)
[ -n "$root" ] || { cat "$work/demo.log"; exit 1; }
cli() { local i=$1; shift; "$bin" --api "http://127.0.0.1:$((port + i))" --token "$(cat "$root/node-$i/admin.token")" "$@"; }

echo "putting $files files ($size_mib MiB) through the three nodes in turn"
i=0
for f in "$work"/in/*.txt; do
  cli $((i % 3)) put "$f" "cluster:/wc/$(basename "$f")" > /dev/null
  i=$((i + 1))
done

start=$(date +%s%N)
cli 0 --json job submit examples/jobs/wordcount.js --dataset 'cluster:/wc/*' --partition-max 8 --follow > "$work/job.json"
end=$(date +%s%N)
job_ms=$(( (end - start) / 1000000 ))

start=$(date +%s%N)
cat "$work"/in/*.txt | tr -cs A-Za-z '\n' | sort | uniq -c > "$work/pipe.txt"
end=$(date +%s%N)
pipe_ms=$(( (end - start) / 1000000 ))

spilled=$(python3 -c 'import json,sys; o=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["output"]; print(o.get("spilled","") if isinstance(o, dict) else "")' "$work/job.json")
if [ -n "$spilled" ]; then cli 0 get "$spilled" "$work/out.json" > /dev/null; else echo '{}' > "$work/out.json"; fi
python3 - "$work/job.json" "$work/pipe.txt" "$work/out.json" <<'PY'
import json, sys
job = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
out = job["output"]
if "spilled" in out:
    out = json.load(open(sys.argv[3]))
pipe = {}
for line in open(sys.argv[2]):
    c, w = line.split()
    pipe[w] = int(c)
same = out == pipe
if not same:
    diff = [(w, out.get(w), pipe.get(w)) for w in set(out) | set(pipe) if out.get(w) != pipe.get(w)]
    print(f"{len(diff)} words differ, e.g. {sorted(diff, key=str)[:5]}; pipeline {len(pipe)} distinct, {sum(pipe.values())} words")
print(f"word count: {len(out)} distinct words, {sum(out.values())} words; equal to the pipeline's: {same}; maps {len(job['children']) - 1}")
sys.exit(0 if same else 1)
PY
echo "map/reduce word count: ${job_ms} ms (submit to output, --follow polling every 300 ms)"
echo "cat | tr | sort | uniq -c: ${pipe_ms} ms"
python3 -c "print(f'ratio (pipeline / job): {$pipe_ms / $job_ms:.2f}x')"

echo "submit to running, $n jobs"
ids=()
for k in $(seq "$n"); do ids+=("$(cli $((k % 3)) job submit examples/jobs/hello.js)"); done
sleep 3
for id in "${ids[@]}"; do cli 0 --json job status "$id"; echo; done | python3 -c '
import json, sys
d = sorted(v["started"] - v["created"] for v in map(json.loads, filter(str.strip, sys.stdin)) if v["started"])
print(f"submit to running: p50 {d[len(d)//2]} ms, p90 {d[int(len(d)*0.9)]} ms, max {d[-1]} ms over {len(d)} jobs")'
