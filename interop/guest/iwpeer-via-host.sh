#!/bin/bash
# iwpeer-via-host.sh (guest) - iwpeer client -> 10.0.2.2:HPORT (host relay) -> back into the
# guest's iwpeer server on 10.0.2.15:GPORT: kernel siw <-> kernel siw over the QEMU user-network
# path that oxrdma uses, so the host's loopback capture shows kernel siw's real FPDUs.
# env: VARIANTS (stock crc), SIZES (1 65536), HPORT, GPORT.  prints CELL kernel-via-host/VARIANT ...
B=/mnt/host/bin; VARIANTS=${VARIANTS:-stock crc}; SIZES=${SIZES:-1 65536}
ulimit -l unlimited
for v in $VARIANTS; do
    $B/siw-load.sh "$v" >/dev/null 2>&1 || { echo "CELL kernel-via-host/$v skip cannot load siw $v"; continue; }
    ok=1 notes=""
    for sz in $SIZES; do
        taskset -c 1 $B/iwpeer server 10.0.2.15 "$GPORT" --size "$sz" --timeout 90 > /tmp/srv.log 2>&1 & s=$!
        sleep 0.5
        taskset -c 0 $B/iwpeer client 10.0.2.2 "$HPORT" --size "$sz" --iters 2 --timeout 90 > /tmp/cli.log 2>&1; c=$?
        wait $s; r=$?
        echo "---- $v size $sz client rc=$c server rc=$r"; sed 's/^/  client: /' /tmp/cli.log; sed 's/^/  server: /' /tmp/srv.log
        [ $c = 0 ] && [ $r = 0 ] || { ok=0; notes+=" size $sz: $(grep -h -m1 FAIL /tmp/cli.log /tmp/srv.log)"; }
    done
    [ $ok = 1 ] && echo "CELL kernel-via-host/$v pass through the host relay, sizes $SIZES" || echo "CELL kernel-via-host/$v fail$notes"
done
