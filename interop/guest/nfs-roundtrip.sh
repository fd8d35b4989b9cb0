#!/bin/bash
# nfs-roundtrip.sh (guest) - mount an NFSv3 export and do file round trips.
# env: SERVER (10.0.2.2), EXPORT (/), OPTS (mount -o options), CELL (result cell name),
#      MAXMB (64), SIW (1: create siw0 on eth0 first, needed for proto=rdma)
# prints STEP lines and finally: CELL $CELL pass|fail NOTE
SERVER=${SERVER:-10.0.2.2}; EXPORT=${EXPORT:-/}; MAXMB=${MAXMB:-64}; CELL=${CELL:-nfs}
M=/mnt/nfs; fails=0; first=""
step() {  # step NAME CMD...
    local n=$1; shift
    if "$@" >/tmp/step.out 2>&1; then echo "STEP $n ok"
    else echo "STEP $n FAIL: $(tail -2 /tmp/step.out | tr '\n' ' ')"; fails=$((fails + 1)); first=${first:-$n}; fi
}
if [ "${SIW:-0}" = 1 ]; then /mnt/host/bin/siw-load.sh stock >/dev/null 2>&1 || true; fi
modprobe nfs; modprobe nfsv3; modprobe rpcrdma 2>/dev/null
mkdir -p $M
t0=$(date +%s.%N)
if ! timeout 90 mount -t nfs -o "$OPTS" "$SERVER:$EXPORT" $M >/tmp/mount.out 2>&1; then
    echo "STEP mount FAIL: $(cat /tmp/mount.out | tr '\n' ' ')"; dmesg | tail -5
    echo "CELL $CELL fail mount -o $OPTS failed: $(head -1 /tmp/mount.out)"; exit 1
fi
echo "STEP mount ok ($(python3 -c "print(round($(date +%s.%N) - $t0, 2))")s) $(grep " $M " /proc/mounts)"
D=$M/ix.$$; step mkdir mkdir "$D"
sizes="0 1 4095 4096 65537 1048576 $((MAXMB * 1048576))"
for sz in $sizes; do
    head -c "$sz" /dev/urandom > /tmp/src.$sz
    step "write-$sz" dd if=/tmp/src.$sz of="$D/f.$sz" bs=1M conv=fsync status=none
done
step remount-cold sh -c "umount $M && mount -t nfs -o '$OPTS' '$SERVER:$EXPORT' $M"
for sz in $sizes; do
    t0=$(date +%s.%N)
    step "read-cmp-$sz" cmp /tmp/src.$sz "$D/f.$sz"
    [ "$sz" -ge 1048576 ] && echo "  read $sz bytes in $(python3 -c "print(round($(date +%s.%N) - $t0, 2))")s"
done
step ls-l sh -c "ls -l $D | tee /dev/stderr | grep -c 'f\\.' | grep -qx $(wc -w <<<"$sizes")"
step stat-size sh -c "[ \$(stat -c %s $D/f.65537) = 65537 ]"
step mkdir-sub mkdir "$D/sub"
step rename mv "$D/f.4096" "$D/sub/renamed"
step rename-check cmp /tmp/src.4096 "$D/sub/renamed"
step symlink ln -s sub/renamed "$D/link"
step readlink sh -c "[ \$(readlink $D/link) = sub/renamed ]"
step follow-link cmp /tmp/src.4096 "$D/link"
step rm sh -c "rm $D/link $D/sub/renamed $D/f.*"
step rmdir sh -c "rmdir $D/sub && rmdir $D"
step gone sh -c "! ls $D 2>/dev/null"
grep -E 'xprt:' /proc/self/mountstats | head -1
step umount umount $M
rm -f /tmp/src.*
if [ $fails = 0 ]; then echo "CELL $CELL pass round trips 0 B..$MAXMB MiB, ls/mkdir/rename/symlink/rm"
else echo "CELL $CELL fail $fails step(s) failed, first: $first"; fi
