#!/bin/bash
# rdma-core-guest.sh (guest) - oxrdma's rdma-core provider over the kernel's siw and rxe.
# Prints CELL lines.  env: HOST_SOFT_PORT (host `oxrdma perf write --listen` on 10.0.2.2),
# H2G_PORT (guest listener the host dials through the port forward), MB (NFS file size, MiB).
B=/mnt/host/bin; OX=$B/oxrdma-rdma-core; T=$B/rdma_core_tests; MB=${MB:-16}
ulimit -l unlimited
cell() { echo "CELL $*"; }
# perf --json -> "BW MB/s, raw TCP T MB/s in the same run, ratio R"
BWR='import json,sys; r=json.loads(sys.stdin.read())["rows"][-1]; print("%.1f MB/s, raw TCP %.1f MB/s in the same run, ratio %.3f" % (r["bw_avg_mbs"], r["tcp_mbs"], r["ratio"]))'
tests() {  # tests DEVICE
    local out; out=$(OXRDMA_RDMA_TEST_DEVICE=$1 OXRDMA_RDMA_TEST_ADDR=10.0.2.15 timeout 300 "$T" --test-threads=1 --nocapture 2>&1)
    echo "$out" | grep -v '^$' | tail -15
    local sum; sum=$(echo "$out" | grep '^test result' | tail -1)
    if echo "$out" | grep -q '^skipping'; then cell "tests-$1" fail "tests skipped: $(echo "$out" | grep -m1 '^skipping')"
    elif echo "$sum" | grep -q '^test result: ok. 5 passed'; then cell "tests-$1" pass "$sum"
    else cell "tests-$1" fail "${sum:-no result}"; fi
}
$B/siw-load.sh stock >/dev/null 2>&1 || { cell tests-siw0 fail "siw did not load"; exit 0; }
tests siw0
# perf write both ends in this guest through kernel siw
o=$($OX --provider rdma-core:siw0 perf write --self --self-addr 10.0.2.15 -s 65536 -n 400 --json 2>&1 | tail -1)
bw=$(echo "$o" | python3 -c "$BWR" 2>/dev/null)
if [ -n "$bw" ]; then cell perf-write-siw0 pass "$bw (64 KiB, both ends rdma-core over kernel siw)"; else cell perf-write-siw0 fail "$o"; fi
# guest rdma-core (kernel siw) dials the host's soft-iWARP perf server
if [ -n "${HOST_SOFT_PORT:-}" ]; then
    o=$($OX --provider rdma-core:siw0 perf write --connect 10.0.2.2:$HOST_SOFT_PORT -s 65536 -n 200 --json 2>&1 | tail -1)
    bw=$(echo "$o" | python3 -c "$BWR" 2>/dev/null)
    if [ -n "$bw" ]; then cell guest-rdma-core-to-host-soft pass "$bw; RDMA Write, kernel siw -> oxrdma soft-iWARP"
    else cell guest-rdma-core-to-host-soft fail "$o"; fi
fi
# the host's soft-iWARP dials a guest rdma-core listener (the host reports the cell)
if [ -n "${H2G_PORT:-}" ]; then
    timeout 90 $OX --provider rdma-core:siw0 perf send --listen 0.0.0.0:$H2G_PORT > /tmp/h2g.log 2>&1 &
    sleep 1; touch /mnt/host/tmp/h2g-ready
    wait; echo "guest listener: $(tail -1 /tmp/h2g.log)"
fi
# the main job on rdma-core: kernel NFS client -> oxrdma nfs serve, both over kernel siw; then
# the same with the server on our soft-iWARP provider (the kernel client still on siw), for a ratio
nfs_rt() {  # nfs_rt CELL PROVIDER RDMAPORT TCPPORT -> sets READ_MBS
    local cell=$1 prov=$2 rp=$3 tp=$4 o="vers=3,proto=rdma,port=$3,mountport=$4,mountproto=tcp,nolock,soft,timeo=100,retrans=2"
    READ_MBS=
    rm -rf /tmp/rcexp; mkdir -p /tmp/rcexp /mnt/rc
    $OX -v --provider "$prov" nfs serve /tmp/rcexp --rdma 10.0.2.15:$rp --tcp 10.0.2.15:$tp > /tmp/rcnfs.log 2>&1 & local s=$!
    sleep 2
    if mount -t nfs -o "$o" 10.0.2.15:/ /mnt/rc; then
        [ -f /tmp/src ] || dd if=/dev/urandom of=/tmp/src bs=1M count="$MB" status=none
        local t0 t1 t2 t3
        t0=$(date +%s.%N); timeout 300 cp /tmp/src /mnt/rc/f; timeout 120 sync; t1=$(date +%s.%N)
        umount /mnt/rc; mount -t nfs -o "$o" 10.0.2.15:/ /mnt/rc
        t2=$(date +%s.%N); rm -f /tmp/back; timeout 300 cp /mnt/rc/f /tmp/back; t3=$(date +%s.%N)
        if cmp -s /tmp/src /tmp/back && cmp -s /tmp/src /tmp/rcexp/f; then
            READ_MBS=$(python3 -c "print(round($MB/($t3-$t2),1))")
            cell "$cell" pass "$prov: $MB MiB written and read back bit-exact; write $(python3 -c "print(round($MB/($t1-$t0),1))") MB/s, cold read $READ_MBS MB/s"
        else cell "$cell" fail "$prov: data differs after the round trip: $(grep -a -m2 -E 'WARN|rpcrdma::driver' /tmp/rcnfs.log | tr '\n' ' ')"; fi
        grep -q 'proto=rdma' /proc/mounts && echo "mounted: $(grep /mnt/rc /proc/mounts)"
        umount /mnt/rc
    else cell "$cell" fail "$prov: mount failed: $(tail -3 /tmp/rcnfs.log | tr '\n' ' ')"; fi
    kill $s 2>/dev/null; wait $s 2>/dev/null
}
nfs_rt nfs-siw0 rdma-core:siw0 20051 2051; hw=$READ_MBS
nfs_rt nfs-soft-iwarp soft-iwarp 20052 2052; sw=$READ_MBS
if [ -n "$hw" ] && [ -n "$sw" ]; then
    cell nfs-read-ratio pass "cold read, server on rdma-core (kernel siw) / on soft-iWARP: $hw / $sw MB/s = $(python3 -c "print(round($hw/$sw,2))")"
fi
# RDS over RDMA between two addresses of this guest (10.0.2.15 responders, 10.0.2.16 client),
# 8 KiB requests / 256 B acks at depth 16, then -D 64 KiB (each request advertises a buffer the
# responder RDMA-writes; the client checks the bytes: mbi), on rdma-core (kernel siw) and on
# soft-iWARP; the rdma_cm treats 127.0.0.0/8 as a wildcard, so --self (127.0.0.1/.2) cannot work
ip addr add 10.0.2.16/24 dev eth0
rds_rt() {  # rds_rt PROVIDER D -> prints "tx/s mbi"
    $OX --provider "$1" rds stress --server --transport rdma -r 10.0.2.15 -a 256 -D "$2" > /tmp/rdssrv.log 2>&1 & local s=$!
    sleep 1
    timeout 60 $OX --provider "$1" rds stress --connect 10.0.2.15 -r 10.0.2.16 --transport rdma -q 8192 -a 256 -d 16 -T 4 -D "$2" 2>&1 |
        awk '$1=="rds-rd"{print $3, $6}'
    kill $s 2>/dev/null; wait $s 2>/dev/null
}
for D in 0 65536; do
    hw=$(rds_rt rdma-core:siw0 $D); sw=$(rds_rt soft-iwarp $D)
    name=rds-siw0; [ "$D" != 0 ] && name=rds-rdma-write-siw0
    if [ -n "$hw" ] && [ -n "$sw" ] && { [ "$D" = 0 ] || [ "$(echo "$hw" | cut -d' ' -f2)" != 0 ]; }; then
        cell $name pass "-D $D: rdma-core (kernel siw) ${hw% *} req/s, mbi ${hw#* } KiB/s; soft-iWARP ${sw% *} req/s, mbi ${sw#* } KiB/s; req/s ratio $(python3 -c "print(round(${hw% *}/max(${sw% *},1),2))")"
    else cell $name fail "-D $D: rdma-core '$hw', soft-iWARP '$sw' (tx/s mbi): $(tail -2 /tmp/rdssrv.log | tr '\n' ' ')"; fi
done
ip addr del 10.0.2.16/24 dev eth0
# rxe (RoCE v2 emulation): the same tests over an InfiniBand-transport device
rdma link delete siw0
if modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0; then
    tests rxe0
    o=$($OX --provider rdma-core:rxe0 perf write --self --self-addr 10.0.2.15 -s 65536 -n 200 --json 2>&1 | tail -1)
    bw=$(echo "$o" | python3 -c "$BWR" 2>/dev/null)
    if [ -n "$bw" ]; then cell perf-write-rxe0 pass "$bw (64 KiB over rxe)"; else cell perf-write-rxe0 fail "$o"; fi
else cell tests-rxe0 fail "rxe did not load"; fi
