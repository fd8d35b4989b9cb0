#!/bin/bash
# nfs-restart.sh (guest) - write a file over an NFSv3 mount while the host restarts the server
# (SIGTERM, then a new instance on the same ports and state directory), then read it back cold.
# env: SERVER (10.0.2.2), OPTS (mount -o options), CELL (result cell name), MB (64), SIW (1)
# prints STEP lines and finally: CELL $CELL pass|fail NOTE
SERVER=${SERVER:-10.0.2.2}; MB=${MB:-64}; CELL=${CELL:-restart}
M=/mnt/nfs
if [ "${SIW:-0}" = 1 ]; then /mnt/host/bin/siw-load.sh stock >/dev/null 2>&1 || true; fi
modprobe nfs; modprobe nfsv3; modprobe rpcrdma 2>/dev/null
mkdir -p $M
if ! timeout 90 mount -t nfs -o "$OPTS" "$SERVER:/" $M >/tmp/mount.out 2>&1; then
    echo "CELL $CELL fail mount -o $OPTS failed: $(head -1 /tmp/mount.out)"; exit 1
fi
head -c $((MB * 1048576)) /dev/urandom > /tmp/src
name=restart-${CELL//\//-}
t0=$(date +%s)
# The host restarts the server once the file on its side passes a quarter of its size.
if ! timeout 300 dd if=/tmp/src of="$M/$name" bs=1M conv=fsync status=none 2>/tmp/dd.out; then
    echo "STEP write FAIL: $(tr '\n' ' ' </tmp/dd.out)"; dmesg | tail -5
    echo "CELL $CELL fail the write across the restart failed: $(head -1 /tmp/dd.out)"; exit 1
fi
echo "STEP write ok ($(( $(date +%s) - t0 )) s)"
grep -E 'xprt:' /proc/self/mountstats | head -1
umount $M
if ! timeout 90 mount -t nfs -o "$OPTS" "$SERVER:/" $M >/tmp/mount.out 2>&1; then
    echo "CELL $CELL fail remount failed: $(head -1 /tmp/mount.out)"; exit 1
fi
if cmp /tmp/src "$M/$name"; then
    echo "STEP read-cmp ok"
    rm -f "$M/$name"; umount $M
    echo "CELL $CELL pass $MB MiB written across a server restart, read back bit-exact"
else
    echo "CELL $CELL fail the file read back differs from what was written"
    umount $M
fi
