#!/bin/bash
# siw-dial-host.sh (guest) - kernel siw initiates to the host's oxrdma iWARP peer:
# iwpeer client 10.0.2.2:HPORT for each siw VARIANT (stock/crc/p2p/crc-p2p) and SIZE.
# env: VARIANTS, SIZES, ITERS, HPORT, OPS.  prints: CELL guest-to-host/VARIANT pass|fail|skip NOTE
B=/mnt/host/bin
VARIANTS=${VARIANTS:-stock crc p2p crc-p2p}; SIZES=${SIZES:-1 4093 65536 1048576}
ITERS=${ITERS:-3}; OPS=${OPS:-send,sendinv,write,read}
ulimit -l unlimited
for v in $VARIANTS; do
    $B/siw-load.sh "$v" >/tmp/load.log 2>&1 || { echo "CELL guest-to-host/$v skip cannot load siw variant"; continue; }
    ok=1 notes=""
    for sz in $SIZES; do
        for try in 1 2 3 4 5 6 7 8 9 10; do      # the host peer restarts between connections
            $B/iwpeer client 10.0.2.2 "$HPORT" --ops "$OPS" --size "$sz" --iters "$ITERS" --timeout 90 > /tmp/cli.log 2>&1
            rc=$?
            grep -q '^CONNECTED' /tmp/cli.log && break
            sleep 1
        done
        echo "---- variant $v size $sz rc=$rc (attempt $try)"; sed 's/^/  iwpeer: /' /tmp/cli.log
        [ $rc = 0 ] || { ok=0; notes+=" size $sz: $(grep -m1 FAIL /tmp/cli.log)"; }
        grep -q '^CONNECTED' /tmp/cli.log || { notes+=" (never connected; other sizes skipped)"; break; }
    done
    [ $ok = 1 ] && echo "CELL guest-to-host/$v pass $OPS both ways, sizes $SIZES" || echo "CELL guest-to-host/$v fail$notes"
done
