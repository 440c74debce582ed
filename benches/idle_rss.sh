#!/usr/bin/env bash
# Resident memory of an idle node: start `shoal serve` (release), create a cluster, wait, read VmRSS.
# Usage: benches/idle_rss.sh [seconds-to-idle]   (needs `cargo build --release` first)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/shoal
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
idle=${1:-20}
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
SHOAL_LOG=warn "$bin" serve --data "$dir/n" --listen "127.0.0.1:$port" >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 50); do "$bin" --data "$dir/n" --api "http://127.0.0.1:$port" cluster status >/dev/null 2>&1 && break; sleep 0.1; done
"$bin" --data "$dir/n" --api "http://127.0.0.1:$port" cluster create --name rss >/dev/null
sleep "$idle"
rss_kb=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
echo "idle node RSS after ${idle}s in a cluster: $((rss_kb / 1024)) MiB (${rss_kb} kB)"
