#!/bin/bash
# rdma-core-guest.sh (guest) - oxrdma's rdma-core provider over the kernel's siw and rxe.
# Prints CELL lines.  env: HOST_SOFT_PORT (host `oxrdma perf write --listen` on 10.0.2.2),
# H2G_PORT (guest listener the host dials through the port forward), MB (NFS file size, MiB).
B=/mnt/host/bin; OX=$B/oxrdma-rdma-core; T=$B/rdma_core_tests; MB=${MB:-16}
ulimit -l unlimited
cell() { echo "CELL $*"; }
tests() {  # tests DEVICE
    local out; out=$(OXRDMA_RDMA_TEST_DEVICE=$1 OXRDMA_RDMA_TEST_ADDR=10.0.2.15 timeout 300 "$T" --test-threads=1 --nocapture 2>&1)
    echo "$out" | grep -v '^$' | tail -15
    local sum; sum=$(echo "$out" | grep '^test result' | tail -1)
    if echo "$out" | grep -q '^skipping'; then cell "tests-$1" fail "tests skipped: $(echo "$out" | grep -m1 '^skipping')"
    elif echo "$sum" | grep -q '^test result: ok. 4 passed'; then cell "tests-$1" pass "$sum"
    else cell "tests-$1" fail "${sum:-no result}"; fi
}
$B/siw-load.sh stock >/dev/null 2>&1 || { cell tests-siw0 fail "siw did not load"; exit 0; }
tests siw0
# perf write both ends in this guest through kernel siw
o=$($OX --provider rdma-core:siw0 perf write --self --self-addr 10.0.2.15 -s 65536 -n 400 --json 2>&1 | tail -1)
bw=$(echo "$o" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read())["rows"][-1]; print(round(r["bw_avg_mbs"],1))' 2>/dev/null)
if [ -n "$bw" ]; then cell perf-write-siw0 pass "$bw MB/s (64 KiB, both ends rdma-core over kernel siw)"; else cell perf-write-siw0 fail "$o"; fi
# guest rdma-core (kernel siw) dials the host's soft-iWARP perf server
if [ -n "${HOST_SOFT_PORT:-}" ]; then
    o=$($OX --provider rdma-core:siw0 perf write --connect 10.0.2.2:$HOST_SOFT_PORT -s 65536 -n 200 --json 2>&1 | tail -1)
    bw=$(echo "$o" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read())["rows"][-1]; print(round(r["bw_avg_mbs"],1))' 2>/dev/null)
    if [ -n "$bw" ]; then cell guest-rdma-core-to-host-soft pass "$bw MB/s RDMA Write, kernel siw -> oxrdma soft-iWARP"
    else cell guest-rdma-core-to-host-soft fail "$o"; fi
fi
# the host's soft-iWARP dials a guest rdma-core listener (the host reports the cell)
if [ -n "${H2G_PORT:-}" ]; then
    timeout 90 $OX --provider rdma-core:siw0 perf send --listen 0.0.0.0:$H2G_PORT > /tmp/h2g.log 2>&1 &
    sleep 1; touch /mnt/host/tmp/h2g-ready
    wait; echo "guest listener: $(tail -1 /tmp/h2g.log)"
fi
# the main job on rdma-core: kernel NFS client -> oxrdma nfs serve, both over kernel siw
mkdir -p /tmp/rcexp /mnt/rc
$OX -v --provider rdma-core:siw0 nfs serve /tmp/rcexp --rdma 10.0.2.15:20051 --tcp 10.0.2.15:2051 > /tmp/rcnfs.log 2>&1 & s=$!
sleep 2
if mount -t nfs -o vers=3,proto=rdma,port=20051,mountport=2051,mountproto=tcp,nolock,soft,timeo=100,retrans=2 10.0.2.15:/ /mnt/rc; then
    dd if=/dev/urandom of=/tmp/src bs=1M count="$MB" status=none
    t0=$(date +%s.%N); timeout 300 cp /tmp/src /mnt/rc/f; timeout 120 sync; t1=$(date +%s.%N)
    umount /mnt/rc; mount -t nfs -o vers=3,proto=rdma,port=20051,mountport=2051,mountproto=tcp,nolock,soft,timeo=100,retrans=2 10.0.2.15:/ /mnt/rc
    t2=$(date +%s.%N); timeout 300 cp /mnt/rc/f /tmp/back; t3=$(date +%s.%N)
    if cmp -s /tmp/src /tmp/back && cmp -s /tmp/src /tmp/rcexp/f; then
        cell nfs-siw0 pass "$MB MiB written and read back bit-exact; write $(python3 -c "print(round($MB/($t1-$t0),1))") MB/s, cold read $(python3 -c "print(round($MB/($t3-$t2),1))") MB/s"
    else cell nfs-siw0 fail "data differs after the round trip: $(grep -a -m2 -E 'WARN|rpcrdma::driver' /tmp/rcnfs.log | tr '\n' ' ')"; fi
    grep -q 'proto=rdma' /proc/mounts && echo "mounted: $(grep /mnt/rc /proc/mounts)"
    umount /mnt/rc
else cell nfs-siw0 fail "mount failed: $(tail -3 /tmp/rcnfs.log | tr '\n' ' ')"; fi
kill $s 2>/dev/null; wait $s 2>/dev/null
# rxe (RoCE v2 emulation): the same tests over an InfiniBand-transport device
rdma link delete siw0
if modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0; then
    tests rxe0
    o=$($OX --provider rdma-core:rxe0 perf write --self --self-addr 10.0.2.15 -s 65536 -n 200 --json 2>&1 | tail -1)
    bw=$(echo "$o" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read())["rows"][-1]; print(round(r["bw_avg_mbs"],1))' 2>/dev/null)
    if [ -n "$bw" ]; then cell perf-write-rxe0 pass "$bw MB/s (64 KiB over rxe)"; else cell perf-write-rxe0 fail "$o"; fi
else cell tests-rxe0 fail "rxe did not load"; fi
