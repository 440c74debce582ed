#!/usr/bin/env bash
# Time from `shoal demo` start until every node of a 3-node demo is up (ONLINE, or DEGRADED when
# the machine's CPU is saturated). Runs it N times. Usage: benches/demo_ready.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/shoal
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
runs=${1:-5}
for i in $(seq "$runs"); do
  start=$(date +%s%N)
  out=$(SHOAL_LOG=warn "$bin" demo --nodes 3 --base-port $((7600 + i * 10)) --exit-when-ready 2>/dev/null | sed -n 1p)
  end=$(date +%s%N)
  echo "run $i: ${out#shoal demo: } (process wall time $(( (end - start) / 1000000 )) ms)"
done
