#!/bin/bash
# nfsd-serve-host.sh (guest) - start kernel nfsd (TCP 2049, RDMA 20049, mountd 20048), first
# check it with the guest's own kernel client over RDMA (baseline), then keep serving until
# the host drops /mnt/host/tmp/nfs-host-done (or WAIT seconds pass).
# env: WAIT (600), BASELINE (1), MAXMB (16), MKFILE (a name: a 64 KiB file of random bytes,
# mode 644, made in /export before the host is told the server is ready)
B=/mnt/host/bin
$B/nfsd-start.sh || { echo "CELL kernel-baseline fail nfsd did not start"; exit 1; }
if [ "${BASELINE:-1}" = 1 ]; then
    SERVER=10.0.2.15 EXPORT=/export CELL=kernel-baseline MAXMB=${MAXMB:-16} \
        OPTS=vers=3,proto=rdma,port=20049,mountport=20048,mountproto=tcp,nolock $B/nfs-roundtrip.sh |
        grep -E '^(CELL|STEP .*FAIL)'
fi
if [ -n "${MKFILE:-}" ]; then
    head -c 65536 /dev/urandom > "/export/$MKFILE" && chmod 644 "/export/$MKFILE" && echo "made /export/$MKFILE"
fi
touch /mnt/host/tmp/nfs-guest-ready
for i in $(seq "${WAIT:-600}"); do [ -e /mnt/host/tmp/nfs-host-done ] && break; sleep 1; done
echo "nfsd stats:"; grep -E '^(rpc|proc3)' /proc/net/rpc/nfsd
ls -la /export | head -20
