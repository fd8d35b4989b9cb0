#!/bin/bash
# siw-serve-host.sh (guest) - kernel siw as the responder for the host's oxrdma iWARP peer:
# runs COUNT iwpeer servers on 10.0.2.15:GPORT, one after the other (the host reaches it
# through run.sh -p HOSTPORT:GPORT).  env: COUNT, GPORT, MAXSIZE.
B=/mnt/host/bin
ulimit -l unlimited
$B/siw-load.sh stock
echo "GUEST-READY"
for i in $(seq "${COUNT:-1}"); do
    $B/iwpeer server 10.0.2.15 "${GPORT:-19872}" --size "${MAXSIZE:-1048576}" --timeout 120 > /tmp/srv.log 2>&1
    rc=$?
    echo "---- guest server #$i rc=$rc"; sed 's/^/  iwpeer: /' /tmp/srv.log
    echo "SERVER $i rc=$rc $(grep -m1 FAIL /tmp/srv.log)"
done
