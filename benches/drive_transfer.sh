#!/usr/bin/env bash
# Cluster drive transfer speed (issue 4 "Speed"): put and get of one large file between two
# real nodes over loopback, side by side in the same run with
#   - single-core SHA-256 throughput of the same file (openssl, sha256sum and `shoal checksum`,
#     the sha2 crate shoal uses; the fastest is the baseline), and
#   - rsync --whole-file to an rsync daemon over loopback (when rsync is installed),
# and the peak RSS (VmHWM) of both nodes while the file moves.
#
# Node A has no volume, node B has one: a put through A spools on A and sends the file to B with
# the signed chunked protocol; a get through A reads it back from B.
#
# Usage: benches/drive_transfer.sh [MiB]   (default 1024; needs `cargo build --release` first;
# SHOAL_BIN=path runs another binary, e.g. an older build to compare side by side)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SHOAL_BIN:-$PWD/target/release/shoal}
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
mib=${1:-1024}
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
rate() { python3 -c "print(f'{$1/($3-$2):.0f}')"; }

pa=$(freeport); pb=$(freeport)
SHOAL_LOG=${SHOAL_LOG:-warn} "$bin" serve --data "$dir/a" --listen "127.0.0.1:$pa" >/dev/null 2>"$dir/a.log" & pids+=($!); pid_a=$!
SHOAL_LOG=warn "$bin" serve --data "$dir/b" --listen "127.0.0.1:$pb" >/dev/null 2>&1 & pids+=($!); pid_b=$!
A=("$bin" --data "$dir/a" --api "http://127.0.0.1:$pa")
B=("$bin" --data "$dir/b" --api "http://127.0.0.1:$pb")
for _ in $(seq 50); do "${A[@]}" cluster status >/dev/null 2>&1 && "${B[@]}" cluster status >/dev/null 2>&1 && break; sleep 0.1; done
"${A[@]}" cluster create --name bench >/dev/null
tok=$("${A[@]}" --json token new | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
"${B[@]}" join "$tok" >/dev/null
"${B[@]}" volume add "$dir/vol-b" --create >/dev/null
# Wait until A knows B's volume and a leader.
for _ in $(seq 100); do
  "${A[@]}" --json volume list | grep -q '"id"' && "${A[@]}" --json meta status | grep -q '"leader": "' && break
  sleep 0.2
done

echo "making a ${mib} MiB file of random bytes..."
head -c "$((mib * 1024 * 1024))" /dev/urandom > "$dir/src.bin"
bytes=$((mib * 1024 * 1024))
cat "$dir/src.bin" > /dev/null   # page cache warm for everyone

t0=$(now); openssl dgst -sha256 "$dir/src.bin" >/dev/null; t1=$(now)
sha_openssl=$(rate $bytes "$t0" "$t1")
t0=$(now); sha256sum "$dir/src.bin" >/dev/null; t1=$(now)
sha_coreutils=$(rate $bytes "$t0" "$t1")
t0=$(now); "$bin" checksum "$dir/src.bin" >/dev/null; t1=$(now)
sha_shoal=$(rate $bytes "$t0" "$t1")
# Both digests a relaying or receiving node takes of each chunk (its own and the whole file's),
# in one pass as the node does (`checksum --chunks`; an older build without it: n/a).
t0=$(now); if "$bin" checksum --chunks "$dir/src.bin" >/dev/null 2>&1; then t1=$(now); sha_both=$(rate $bytes "$t0" "$t1"); else sha_both=0; fi
sha=$(( sha_openssl > sha_coreutils ? sha_openssl : sha_coreutils ))
sha=$(( sha_shoal > sha ? sha_shoal : sha ))

# CPU-seconds (user + system) of each process for each transfer: the nodes' from /proc, the
# client's from bash's `time`.
clk=$(getconf CLK_TCK)
cpu_of() { awk -v t="$clk" '{printf "%.3f", ($14+$15)/t}' "/proc/$1/stat"; }
TIMEFORMAT='%3U %3S'
a0=$(cpu_of $pid_a); b0=$(cpu_of $pid_b)
t0=$(now); { time "${A[@]}" put "$dir/src.bin" cluster:/bench/big.bin >/dev/null 2>&1 ; } 2>"$dir/put.time"; t1=$(now)
put=$(rate $bytes "$t0" "$t1")
a1=$(cpu_of $pid_a); b1=$(cpu_of $pid_b)
t0=$(now); { time "${A[@]}" get cluster:/bench/big.bin "$dir/back.bin" >/dev/null 2>&1 ; } 2>"$dir/get.time"; t1=$(now)
get=$(rate $bytes "$t0" "$t1")
a2=$(cpu_of $pid_a); b2=$(cpu_of $pid_b)
client_put=$(awk '{printf "%.3f", $1+$2}' "$dir/put.time")
client_get=$(awk '{printf "%.3f", $1+$2}' "$dir/get.time")
cmp -s "$dir/src.bin" "$dir/back.bin" || { echo "the file came back different!" >&2; exit 1; }
hwm_a=$(awk '/VmHWM/ {print $2}' /proc/$pid_a/status)
hwm_b=$(awk '/VmHWM/ {print $2}' /proc/$pid_b/status)

rsync_rate="n/a"
if command -v rsync >/dev/null; then
  pr=$(freeport)
  mkdir -p "$dir/rsync-dst"
  cat > "$dir/rsyncd.conf" <<EOF
use chroot = no
uid = $(id -u)
gid = $(id -g)
[dst]
path = $dir/rsync-dst
read only = no
EOF
  rsync --daemon --no-detach --port="$pr" --config="$dir/rsyncd.conf" --address=127.0.0.1 & pids+=($!)
  sleep 0.5
  t0=$(now); rsync --whole-file "$dir/src.bin" "rsync://127.0.0.1:$pr/dst/" ; t1=$(now)
  rsync_rate=$(rate $bytes "$t0" "$t1")
fi

mb() { python3 -c "print(f'{$1/1048576:.0f} MiB/s')"; }
pct() { python3 -c "print(f'{100*$1/$2:.0f}%')"; }
echo "file: ${mib} MiB, machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "sha256 single core: openssl $(mb "$sha_openssl"), sha256sum $(mb "$sha_coreutils"), shoal checksum $(mb "$sha_shoal"); baseline (fastest) $(mb $sha)"
echo "shoal put A->B:     $(mb "$put")  ($(pct "$put" $sha) of sha256)"
echo "shoal get B->A:     $(mb "$get")  ($(pct "$get" $sha) of sha256)"
[ "$rsync_rate" != "n/a" ] && echo "rsync --whole-file: $(mb "$rsync_rate")  ($(pct "$rsync_rate" $sha) of sha256)"
grep -hE "put|copy sent" "$dir/a.log" | tail -3 || true
echo "peak RSS: node A $((hwm_a / 1024)) MiB, node B $((hwm_b / 1024)) MiB"
# CPU per GiB of each process against its floor: the SHA-256 passes that hop makes over the
# bytes (read from the code, below) times the single-core cost of one pass (`shoal checksum`,
# the sha2 crate, measured above). Put: the client hashes once as it sends; A (receiving)
# hashes the whole file and each chunk (the chunk's SHA-256 is also its signature's body
# hash); B (the copy) hashes each chunk's body once for the signature and the chunk check,
# and feeds it to the whole-file hash. Get: B hashes each piece it reads; A checks each
# piece's SHA-256 and the whole file's; the client checks the whole file. (A node's two digests
# of a chunk share one pass over its bytes, `disk::hash`, where the CPU has SHA instructions:
# the floor stays two passes, as the issue defines it.)
gib=$(python3 -c "print($bytes/2**30)")
per_pass=$(python3 -c "print(2**30/$sha_shoal)")
# The kernel's side of a loopback TCP hop, which every hop pays beside its hashing: one
# process sends 1 GiB in 4 MiB writes, another receives it into a reused buffer, doing
# nothing else; CPU-seconds (user + system) of each side, measured now, on this machine.
read -r tcp_send tcp_recv < <(python3 - <<'PY'
import os, resource, socket
N, B = 1 << 30, 4 << 20
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
pid = os.fork()
if pid == 0:
    c = socket.socket(); c.connect(srv.getsockname()); buf = b"x" * B
    for _ in range(N // B): c.sendall(buf)
    c.close(); os._exit(0)
conn, _ = srv.accept(); buf = bytearray(B); view = memoryview(buf)
before = resource.getrusage(resource.RUSAGE_SELF)
while conn.recv_into(view): pass
os.waitpid(pid, 0)
me, child = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
recv = me.ru_utime + me.ru_stime - before.ru_utime - before.ru_stime
print(f"{child.ru_utime + child.ru_stime:.3f} {recv:.3f}")
PY
)
line() { # name cpu-seconds passes tcp-sends tcp-receives
  python3 -c "c=$2/$gib; f=$3*$per_pass; t=f+$4*$tcp_send+$5*$tcp_recv; print(f'  {\"$1\":<22} {c:6.2f} CPU-s/GiB  {$3} passes, floor {f:5.2f} ({c/f:4.2f}x)  with its TCP hops {t:5.2f} ({c/t:4.2f}x)')"
}
both=$(python3 -c "print(f'{2**30/$sha_both:.2f} s/GiB' if $sha_both else 'n/a')")
echo "CPU per GiB (one SHA-256 pass: $(python3 -c "print(f'{$per_pass:.2f}')") s/GiB; a chunk's and the whole file's digests in one pass: $both; a loopback TCP hop: send $tcp_send, receive $tcp_recv CPU-s/GiB):"
line "put: client" "$client_put" 1 1 0
line "put: node A (receives)" "$(python3 -c "print($a1-$a0)")" 2 1 1
line "put: node B (copy)" "$(python3 -c "print($b1-$b0)")" 2 0 1
line "get: node B (copy)" "$(python3 -c "print($b2-$b1)")" 1 1 0
line "get: node A (serves)" "$(python3 -c "print($a2-$a1)")" 2 1 1
line "get: client" "$client_get" 1 0 1
