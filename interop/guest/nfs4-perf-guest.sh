#!/bin/bash
# nfs4-perf-guest.sh (guest) - the kernel NFS client's cold sequential read over
# vers=4.1,proto=rdma, from the guest's kernel nfsd and from oxrdma nfs serve in the same guest
# (as perf-guest.sh does for NFSv3), each server pinned to vCPU 1 where we can, the reader to 0.
# Prints "PERF KEY VALUE UNIT" and CELL lines.
# env: MB (64), OX_NFS (1 when `oxrdma nfs serve` has landed)
B=/mnt/host/bin; OX=$B/oxrdma; MB=${MB:-64}
perf() { echo "PERF $1 $2 $3"; }
readbw() {  # readbw SERVER EXPORT OPTS -> MB/s of a cold MB MiB read
    mkdir -p /mnt/p
    timeout 120 mount -t nfs -o "$3" "$1:$2" /mnt/p || return 1
    grep " /mnt/p " /proc/mounts >&2
    timeout 300 dd if=/dev/urandom of=/mnt/p/big bs=1M count="$MB" conv=fsync status=none || return 1
    umount /mnt/p; sync; echo 3 > /proc/sys/vm/drop_caches
    timeout 120 mount -t nfs -o "$3" "$1:$2" /mnt/p || return 1
    local t0 t1; t0=$(date +%s.%N)
    taskset -c 0 timeout 300 dd if=/mnt/p/big of=/dev/null bs=1M status=none || return 1
    t1=$(date +%s.%N); rm -f /mnt/p/big; umount /mnt/p
    python3 -c "print(round($MB / ($t1 - $t0), 1))"
}
# nfsd's NFSv4 grace period: the shortest it takes (10 s), and wait it out, since OPEN is
# refused with NFS4ERR_GRACE until then.
GRACE=10 $B/nfsd-start.sh
sleep 11
r=$(readbw 10.0.2.15 /export vers=4.1,proto=rdma,port=20049)
if [ -n "$r" ]; then perf nfs4.read.kernel "$r" MB/s; echo "CELL nfs4/kernel-nfsd-read pass $r MB/s ($MB MiB cold read, vers=4.1,proto=rdma)"
else echo "CELL nfs4/kernel-nfsd-read fail mount/read failed"; fi
if [ "${OX_NFS:-0}" = 1 ]; then
    mkdir -p /tmp/oxexp
    # --nfs4-grace 0: a fresh server holds no state from an earlier run to be reclaimed.
    taskset -c 1 $OX nfs serve /tmp/oxexp --rdma 10.0.2.15:20050 --tcp 10.0.2.15:2050 --no-portmap \
        --nfs4-grace 0 > /tmp/oxnfs.log 2>&1 & s=$!
    for i in $(seq 50); do grep -q '^ADDRS' /tmp/oxnfs.log && break; sleep 0.2; done
    r=$(readbw 10.0.2.15 / vers=4.1,proto=rdma,port=20050)
    kill $s; wait $s
    if [ -n "$r" ]; then perf nfs4.read.oxrdma "$r" MB/s; echo "CELL nfs4/oxrdma-serve-read pass $r MB/s ($MB MiB cold read, vers=4.1,proto=rdma)"
    else tail -5 /tmp/oxnfs.log; echo "CELL nfs4/oxrdma-serve-read fail mount/read failed"; fi
fi
