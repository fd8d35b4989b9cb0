#!/bin/bash
# iwpeer-selftest.sh (guest) - iwpeer client <-> iwpeer server over kernel siw inside the guest
# (10.0.2.15 on eth0; rdma_cm cannot use lo), for each siw VARIANT and SIZE, capturing the
# TCP stream with pcapture.py into /mnt/host/cap/siw-VARIANT.pcap (smallest size only).
# env: VARIANTS ("stock crc p2p crc-p2p"), SIZES ("1 4093 65536 1048576"), ITERS (3), PORT (19871)
# prints: CELL kernel-kernel/VARIANT pass|fail|skip NOTE
H=/mnt/host; B=$H/bin
VARIANTS=${VARIANTS:-stock crc p2p crc-p2p}; SIZES=${SIZES:-1 4093 65536 1048576}
ITERS=${ITERS:-3}; PORT=${PORT:-19871}
ulimit -l unlimited
for v in $VARIANTS; do
    if ! $B/siw-load.sh "$v" >/tmp/load.log 2>&1; then
        echo "CELL kernel-kernel/$v skip siw variant not loadable: $(tail -1 /tmp/load.log)"; continue
    fi
    ok=1 notes=""
    first=1
    for sz in $SIZES; do
        cap=
        if [ $first = 1 ]; then
            python3 $B/pcapture.py lo $H/cap/siw-$v.pcap $PORT > /tmp/cap.log 2>&1 & cap=$!
            sleep 1
        fi
        for attempt in 1 2; do
            dmesg -C 2>/dev/null
            taskset -c 1 $B/iwpeer server 10.0.2.15 $PORT --size $sz --timeout 60 > /tmp/srv.log 2>&1 & srv=$!
            sleep 0.5
            taskset -c 0 $B/iwpeer client 10.0.2.15 $PORT --size $sz --iters $ITERS --timeout 60 > /tmp/cli.log 2>&1; crc=$?
            wait $srv; src=$?
            echo "---- variant $v size $sz attempt $attempt: client rc=$crc server rc=$src"
            sed 's/^/  client: /' /tmp/cli.log; sed 's/^/  server: /' /tmp/srv.log
            [ $crc = 0 ] && [ $src = 0 ] && break
            dmesg | tail -15 | sed 's/^/  dmesg: /'
            # rc 2 = connection/setup failure (retried once, and reported); rc 1 = data verdict
            { [ $crc = 1 ] || [ $src = 1 ]; } && break
            notes+=" [size $sz attempt $attempt setup failure: $(grep -h -m1 FAIL /tmp/cli.log /tmp/srv.log)]"
        done
        [ -n "$cap" ] && { sleep 0.3; kill $cap; wait $cap; }
        if [ $crc != 0 ] || [ $src != 0 ]; then ok=0; notes+=" size $sz: $(grep -h -m1 FAIL /tmp/cli.log /tmp/srv.log)"; fi
        first=0
    done
    if [ $ok = 1 ]; then
        echo "CELL kernel-kernel/$v pass send,sendinv,write,read both ways, sizes $SIZES x$ITERS$notes"
    else
        echo "CELL kernel-kernel/$v fail$notes"
    fi
done
