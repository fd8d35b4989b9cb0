#!/bin/bash
# rds-host-peer.sh (guest) - kernel rds_tcp side of scenario rds; phases are paced through
# flag files in the shared dir (/mnt/host/tmp): the host writes host-*, the guest guest-*.
# env: N (ping count), CONG_N (congestion datagrams)
B=/mnt/host/bin; F=/mnt/host/tmp; N=${N:-50}; CONG_N=${CONG_N:-300}
flag() { touch "$F/guest-$1"; }
wait_host() { for i in $(seq "${2:-120}"); do [ -e "$F/host-$1" ] && return 0; [ -e "$F/host-abort" ] && return 1; sleep 1; done; return 1; }
res() {  # res CELL LOGFILE : CELL pass if the log has OK and no FAIL
    if grep -q '^OK' "$2" && ! grep -q '^FAIL' "$2"; then echo "CELL $1 pass $(grep -m1 '^OK' "$2")"
    else
        local why; why=$(grep -m1 -E '^FAIL|Error|error' "$2")
        echo "CELL $1 fail ${why:-no complete result (stopped after the host finished)}"
    fi
}
modprobe rds; modprobe rds_tcp
python3 $B/rds-peer.py echo 10.0.2.15 4000 100000 600 > /tmp/echo.log 2>&1 &
sleep 1; flag ready
# phase 1: host pings our echo (host-to-guest); then we ping the host's echo (guest-to-host)
wait_host echo-up 300 || { echo "host never came up"; exit 0; }
for sz in 256 8192; do
    timeout 120 python3 $B/rds-peer.py ping 10.0.2.15 $((4100 + sz % 100)) 10.0.2.2 4001 "$N" "$sz" 30 > /tmp/p.log 2>&1
    cat /tmp/p.log; res "guest-to-host/ping-$sz" /tmp/p.log
done
# the congestion receiver binds now (the host sends once it sees "pinged") and reads only after
# 8 s, so its 64 KiB receive buffer fills and the kernel marks port 4020 congested
python3 $B/rds-peer.py recv 10.0.2.15 4020 "$CONG_N" 8192 8 300 65536 > /tmp/cong.log 2>&1 &
cong=$!
sleep 1
flag pinged
# phase 2: congestion: the host blasts 8 KiB datagrams at port 4020, which starts reading late;
# once the host says its sends are done, the receiver gets 60 s more
wait_host cong-sent 400
for i in $(seq 60); do kill -0 $cong 2>/dev/null || break; sleep 1; done
kill $cong 2>/dev/null; wait $cong; cat /tmp/cong.log; res congestion/delivered-in-order /tmp/cong.log
flag cong-done
# phase 3: a new host process (a restart) has pinged us; now we ping its echo
wait_host restarted 120 && {
    timeout 120 python3 $B/rds-peer.py ping 10.0.2.15 4200 10.0.2.2 4001 "$N" 256 30 > /tmp/p.log 2>&1
    cat /tmp/p.log; res restart/guest-to-host /tmp/p.log
}
flag done
wait_host finished 60
ss -tn | grep -E 'State|16385'
cat /tmp/echo.log
