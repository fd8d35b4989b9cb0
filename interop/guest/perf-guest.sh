#!/bin/bash
# perf-guest.sh (guest) - same-guest performance pairs, ends pinned to different vCPUs (taskset;
# the guest's TSCs drift apart under TCG).  Prints "PERF KEY VALUE UNIT" lines and CELL lines.
# env: DUR (5), OX_PERF / OX_NFS / OX_RDS / OX_RPC = 1 when that oxrdma layer has landed, MB (64),
#      RDS_N (300), FILES (2000), RPC_TCP / RPC_RDMA (the host's `rpc serve-null`, seen from here),
#      RPC_DUR (10)
B=/mnt/host/bin; OX=$B/oxrdma; DUR=${DUR:-5}; MB=${MB:-64}; RDS_N=${RDS_N:-300}; FILES=${FILES:-2000}
ulimit -l unlimited
$B/siw-load.sh stock >/dev/null
perf() { echo "PERF $1 $2 $3"; }
# ---- iWARP RDMA Write bandwidth: kernel siw (ib_write_bw) vs oxrdma perf write
timeout $((DUR + 60)) taskset -c 1 ib_write_bw -d siw0 -R -F -D "$DUR" -s 65536 --report_gbits >/dev/null 2>&1 & s=$!
sleep 2
timeout $((DUR + 60)) taskset -c 0 ib_write_bw -d siw0 -R -F -D "$DUR" -s 65536 --report_gbits 10.0.2.15 > /tmp/bw 2>&1
wait $s
# perftest derives Gb/s from rdtsc, which is garbage when the guest's vCPU TSCs drift (it has
# printed 0.00 here); with -D the iteration count covers DUR wall-clock seconds, so use that.
bw=$(awk -v d="$DUR" '/^ *65536 / {printf "%.3f", $2 * 65536 * 8 / d / 1e9}' /tmp/bw | tail -1)
echo "ib_write_bw's own figure: $(awk '/^ *65536 / {print $4}' /tmp/bw | tail -1) Gb/s (rdtsc-based)"
if [ -n "$bw" ]; then perf siw.write_bw.kernel "$bw" Gb/s; echo "CELL siw/ib_write_bw pass $bw Gb/s (64 KiB, ${DUR}s)"
else cat /tmp/bw; echo "CELL siw/ib_write_bw fail no result"; fi
if [ "${OX_PERF:-0}" = 1 ]; then
    # 64 KiB RDMA Writes with 128 in flight (ib_write_bw's default tx depth); the bandwidth is
    # bytes over wall-clock time (CLOCK_MONOTONIC), in MB/s of 10^6 bytes.
    timeout $((DUR + 120)) taskset -c 1 $OX perf write --listen 10.0.2.15:19890 > /tmp/oxs 2>&1 & s=$!
    sleep 2
    timeout $((DUR + 120)) taskset -c 0 $OX perf write --connect 10.0.2.15:19890 -s 65536 -t 128 -n "${OX_PERF_ITERS:-400}" --json > /tmp/ox 2>&1
    wait $s
    ob=$(python3 -c 'import json,sys; r=json.loads(open("/tmp/ox").read().strip().splitlines()[-1])["rows"][-1]; print(round(r["bw_avg_mbs"]*8/1000, 3))' 2>/dev/null)
    if [ -n "$ob" ]; then perf siw.write_bw.oxrdma "$ob" Gb/s; echo "CELL siw/oxrdma-perf-write pass $ob Gb/s"
    else cat /tmp/ox /tmp/oxs; echo "CELL siw/oxrdma-perf-write fail no JSON row in output"; fi
fi
# ---- NFSv3/RDMA, kernel client over siw: kernel nfsd vs oxrdma nfs serve, in turn, each
# exporting a tmpfs of its own in this guest.  Per server: a timed 64 MiB write (dd conv=fsync:
# the time includes the COMMIT, so the data is on the server), a cold 64 MiB read (umount, sync,
# drop the page cache, dentries and inodes, then mount again: both servers run in this guest, so
# this drops the server's cache too - although a tmpfs export keeps its pages, for both servers
# alike), a check that the file read back equals what was written, and the small-file workload
# (smallfiles.py: FILES x create, stat, remove).  The client's dd runs on vCPU 0, each server is
# pinned to vCPU 1 where we can (oxrdma; nfsd's threads are the kernel's).
head -c $((MB << 20)) /dev/urandom > /tmp/src.dat
nfsmount() { timeout 120 mount -t nfs -o "$3" "$1:$2" /mnt/p; }
nfspair() {  # nfspair SERVER EXPORT OPTS TAG -> PERF lines nfs.{write,read,small.*}.TAG, CELL lines
    local tag=$4 t0 t1 w r out
    mkdir -p /mnt/p
    nfsmount "$1" "$2" "$3" || { echo "CELL nfs/$tag fail mount failed"; return 1; }
    grep " /mnt/p " /proc/mounts
    sync; echo 3 > /proc/sys/vm/drop_caches
    t0=$(date +%s.%N)
    taskset -c 0 timeout 300 dd if=/tmp/src.dat of=/mnt/p/big bs=1M conv=fsync status=none || { umount /mnt/p; echo "CELL nfs/$tag-write fail dd failed"; return 1; }
    t1=$(date +%s.%N)
    w=$(python3 -c "print(round($MB / ($t1 - $t0), 1))")
    perf nfs.write.$tag "$w" MB/s; echo "CELL nfs/$tag-write pass $w MB/s ($MB MiB, dd conv=fsync, rdma)"
    umount /mnt/p; sync; echo 3 > /proc/sys/vm/drop_caches
    nfsmount "$1" "$2" "$3" || { echo "CELL nfs/$tag-read fail remount failed"; return 1; }
    t0=$(date +%s.%N)
    taskset -c 0 timeout 300 dd if=/mnt/p/big of=/dev/null bs=1M status=none || { umount /mnt/p; echo "CELL nfs/$tag-read fail dd failed"; return 1; }
    t1=$(date +%s.%N)
    r=$(python3 -c "print(round($MB / ($t1 - $t0), 1))")
    if timeout 120 cmp -s /tmp/src.dat /mnt/p/big; then
        perf nfs.read.$tag "$r" MB/s; echo "CELL nfs/$tag-read pass $r MB/s ($MB MiB cold read, rdma)"
    else echo "CELL nfs/$tag-read fail the file read back differs from what was written"; fi
    rm -f /mnt/p/big
    taskset -c 0 timeout 600 python3 $B/smallfiles.py /mnt/p/sf "$FILES" > /tmp/sf.out 2>&1
    grep -v '^SMALL' /tmp/sf.out | sed "s/^/smallfiles $tag: /"
    out=$(grep -m1 '^SMALL' /tmp/sf.out || tail -1 /tmp/sf.out)
    if [ "${out%% *}" = SMALL ]; then
        read -r _ c st rmv <<<"$out"
        for ph in create:$c stat:$st remove:$rmv total:$(python3 -c "print($c + $st + $rmv)"); do
            local n=$FILES; [ "${ph%%:*}" = total ] && n=$((3 * FILES))
            perf "nfs.small.${ph%%:*}.$tag" "$(python3 -c "print(round($n / ${ph#*:}, 1))")" ops/s
        done
        echo "CELL nfs/$tag-smallfiles pass create ${c}s, stat ${st}s, remove ${rmv}s ($FILES files)"
    else echo "CELL nfs/$tag-smallfiles fail $out"; fi
    umount /mnt/p
}
$B/nfsd-start.sh >/dev/null 2>&1
nfspair 10.0.2.15 /export vers=3,proto=rdma,port=20049,mountport=20048,mountproto=tcp,nolock kernel
if [ "${OX_NFS:-0}" = 1 ]; then
    mkdir -p /tmp/oxexp; mountpoint -q /tmp/oxexp || mount -t tmpfs -o size=1g tmpfs /tmp/oxexp
    taskset -c 1 $OX nfs serve /tmp/oxexp --rdma 10.0.2.15:20050 --tcp 10.0.2.15:2050 --no-portmap > /tmp/oxnfs.log 2>&1 & s=$!
    for i in $(seq 50); do grep -q '^ADDRS' /tmp/oxnfs.log && break; sleep 0.2; done
    nfspair 10.0.2.15 / vers=3,proto=rdma,port=20050,mountport=2050,mountproto=tcp,nolock oxrdma || tail -5 /tmp/oxnfs.log
    kill $s; wait $s
fi
# ---- RDS datagram rate into a kernel rds_tcp receiver (netns ns1): kernel sender vs oxrdma sender
modprobe rds_tcp; modprobe veth
ip netns add ns1; ip link add v0 type veth peer name v1; ip link set v1 netns ns1
# The receiver is 10.99.0.200; the kernel sender is 10.99.0.1 and oxrdma 10.99.0.3. Both must be
# lower than the receiver (the lower address connects), and they must differ: rds_tcp keeps the
# kernel sender's connection up after its socket closes, and while it is up the receiver shuts
# down any other connection from 10.99.0.1 (rds_tcp_accept_one).
ip addr add 10.99.0.1/24 dev v0; ip addr add 10.99.0.3/24 dev v0; ip link set v0 up
ip -n ns1 addr add 10.99.0.200/24 dev v1; ip -n ns1 link set v1 up; ip -n ns1 link set lo up
rdsrate() {  # rdsrate SIZE PORT SENDER... -> msg/s seen by the receiver
    ip netns exec ns1 taskset -c 1 python3 $B/rds-peer.py recv 10.99.0.200 "$2" "$RDS_N" "$1" 0 120 > /tmp/rr 2>&1 & local r=$!
    sleep 1; shift 2
    taskset -c 0 "$@" > /tmp/rs 2>&1 & local w=$!
    wait $r; local rc=$?; kill $w 2>/dev/null; wait $w 2>/dev/null
    [ $rc = 0 ] && sed -n 's/.* \([0-9]*\) msg\/s.*/\1/p' /tmp/rr
}
# Linux's rds_tcp sends a new peer's first datagrams on path 0 until the multipath probe has
# answered, then on the path its port hashes to: a measured run that starts before the probe can
# see its first datagrams overtaken (seen: the receiver's first datagram was #10 and #13, twice
# in a row on a loaded host). Prime the kernel sender's connection once, with one datagram to a
# port nobody binds (dropped), so both pairs measure an established path; rds_tcp keeps that
# connection after the socket closes. oxrdma's sender gets no such head start (conservative).
python3 $B/rds-peer.py send 10.99.0.1 4399 10.99.0.200 4399 1 64 1 > /dev/null 2>&1; sleep 2
for sz in 8192 256; do
    k=$(rdsrate $sz $((4300 + sz % 1000)) python3 $B/rds-peer.py send 10.99.0.1 4400 10.99.0.200 $((4300 + sz % 1000)) "$RDS_N" "$sz")
    if [ -n "$k" ]; then perf rds.$sz.kernel "$k" msg/s; echo "CELL rds/rds_tcp-$sz pass $k msg/s"
    else cat /tmp/rr /tmp/rs; echo "CELL rds/rds_tcp-$sz fail no rate"; fi
    if [ "${OX_RDS:-0}" = 1 ]; then
        o=$(rdsrate $sz $((4500 + sz % 1000)) $OX rds peer --connect 10.99.0.200:16385 --local 10.99.0.3 --bind 10.99.0.3 --remote 10.99.0.200 \
            send --port 4401 --to $((4500 + sz % 1000)) --count "$RDS_N" --size "$sz")
        if [ -n "$o" ]; then perf rds.$sz.oxrdma "$o" msg/s; echo "CELL rds/oxrdma-$sz pass $o msg/s"
        else cat /tmp/rr /tmp/rs; echo "CELL rds/oxrdma-$sz fail no rate"; fi
    fi
done
# ---- ONC RPC NULL calls across QEMU's user network: `oxrdma rpc bench` here against the host's
# `oxrdma rpc serve-null` (10.0.2.2 is the host's 127.0.0.1), RPC-over-RDMA over oxrdma's own
# soft-iWARP at both ends vs ONC RPC over TCP, depth 1 and 16.  One bench per depth measures TCP,
# then RDMA, RPC_DUR seconds each, on fresh connections.
if [ "${OX_RPC:-0}" = 1 ] && [ -n "${RPC_TCP:-}" ] && [ -n "${RPC_RDMA:-}" ]; then
    RPC_DUR=${RPC_DUR:-10}
    for d in 1 16; do
        timeout $((2 * RPC_DUR + 90)) $OX rpc bench --tcp "$RPC_TCP" --rdma "$RPC_RDMA" --depth $d \
            --duration "$RPC_DUR" --json > /tmp/rb$d 2>/tmp/rb$d.err
        rc=$?
        # PERF rpc.dD.{tcp,rdma}.{cps,p50,p99} (calls/s, µs), from the two runs of the JSON object
        if out=$(python3 - /tmp/rb$d $d <<'PY'
import json, sys
o = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
d = sys.argv[2]
for r in o["runs"]:
    t = r["target"].split(":")[0]
    if r["errors"] or not r["calls"]:
        sys.exit(f"{t}: {r['calls']} calls, {r['errors']} errors")
    print(f"PERF rpc.d{d}.{t}.cps {r['calls_per_sec']} calls/s")
    for k in ("p50", "p99"):
        print(f"PERF rpc.d{d}.{t}.{k} {r['latency_us'][k]} us")
PY
        ) && [ $rc = 0 ]; then
            echo "$out"
            echo "CELL rpc/bench-d$d pass $(grep -c '\.cps ' <<<"$out") transports, ${RPC_DUR}s each"
        else echo "CELL rpc/bench-d$d fail rc=$rc $out $(tail -2 /tmp/rb$d.err | tr '\n' ' ')"; fi
    done
fi
