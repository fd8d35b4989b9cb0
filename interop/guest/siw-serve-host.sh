#!/bin/bash
# siw-serve-host.sh (guest) - kernel siw as the responder for the host's oxrdma iWARP peer:
# runs up to COUNT iwpeer servers on 10.0.2.15:GPORT, one after the other (the host reaches
# it through run.sh -p HOSTPORT:GPORT), until the host drops /mnt/host/tmp/siw-host-done.
# The first LISTENING is signalled to the host as /mnt/host/tmp/siw-guest-listening.
# env: COUNT, GPORT, MAXSIZE.
B=/mnt/host/bin; done_flag=/mnt/host/tmp/siw-host-done ready_flag=/mnt/host/tmp/siw-guest-listening
ulimit -l unlimited
$B/siw-load.sh stock
echo "GUEST-READY"
for i in $(seq "${COUNT:-1}"); do
    [ -e $done_flag ] && break
    $B/iwpeer server 10.0.2.15 "${GPORT:-19872}" --size "${MAXSIZE:-1048576}" --timeout 120 > /tmp/srv.log 2>&1 &
    s=$!
    # Tell the host once a listener exists: QEMU's user networking accepts a host connection
    # before the guest listens and delivers it much later, stale, to whichever server listens.
    if [ ! -e $ready_flag ]; then
        for _ in $(seq 100); do grep -q '^LISTENING' /tmp/srv.log && break; kill -0 $s 2>/dev/null || break; sleep 0.1; done
        grep -q '^LISTENING' /tmp/srv.log && touch $ready_flag
    fi
    while kill -0 $s 2>/dev/null; do
        if [ -e $done_flag ] && ! grep -q '^CONNECTED' /tmp/srv.log; then kill $s; break; fi
        sleep 0.5
    done
    wait $s; rc=$?
    grep -q '^CONNECTED' /tmp/srv.log || { echo "---- guest server #$i: no connection"; continue; }
    echo "---- guest server #$i rc=$rc"; sed 's/^/  iwpeer: /' /tmp/srv.log
    echo "SERVER $i rc=$rc $(grep -m1 FAIL /tmp/srv.log)"
    # what kernel siw said about a failed connection (terminate reasons, IRQ/ORQ overflow)
    [ "$rc" = 0 ] || dmesg | grep -iE 'siw|iwarp|rdma' | tail -20 | sed 's/^/  dmesg: /'
done
