#!/bin/bash
# oxrdma RDS/TCP (host) <-> kernel rds_tcp (guest, python AF_RDS): datagrams both ways,
# ping/pong 256 B and 8 KiB, congestion, and the kernel taking a new connection after the host restarts.
# limit: 900
# ci: yes
#
# Linux keeps only RDS/TCP connections opened by the numerically smaller address; the host
# appears as 10.0.2.2 < 10.0.2.15, so the host side connects, through -p $HP:16385.
# Host commands (OX_RDS_CMD overrides "rds peer"), see interop/README.md:
#   oxrdma rds peer --connect 127.0.0.1:HP --local 10.0.2.2 --remote 10.0.2.15 MODE ...
# The kernel sees every host process as 10.0.2.2 (QEMU user networking), and rds_tcp keeps one
# connection per peer address: while one is up it shuts down any other (rds_tcp_accept_one in
# Linux 6.1). So one host process runs at a time. Each starts by pinging the kernel's port 0
# until a pong comes (the kernel lets a new connection in once it has seen the last one close),
# and each new process is a restart of the host node. The host's echo for the guest's pings
# runs in the same process as what else runs then (--echo 4001).
#
# Cell rds-ping/kernel uses the rds-ping style command that exists today:
#   oxrdma rds ping 127.0.0.1 --tport HP -I 127.0.0.0 -c 5
# The kernel answers pings to RDS port 0 itself, so no guest program is needed. The RDS
# headers carry no addresses, so what the host stack calls itself does not matter to the kernel,
# which sees 10.0.2.2. It matters to oxrdma: like Linux, it keeps only connections opened by the
# lower address. With -I 127.0.0.2 it dialled 127.0.0.1, closed its own connection at once (FIN
# before any data) and never got a pong. With -I 127.0.0.0 (lower than 127.0.0.1) it keeps the
# connection, and 5/5 pongs came back.
. "$(dirname "$0")/../lib/common.sh"
F=$IX_SHARE/tmp
if ix_landed rds ping; then
    HPP=${IX_RDS_PING_HP:-26386}
    rm -f "$F/guest-ping-ready" "$F/host-ping-done"
    plog=$IX_SCN_OUT/guest-ping.log
    ix_capture_start "$IX_SCN_OUT/rds-ping-host-lo.pcap" "$HPP"
    ix_guest "$plog" -t 200 -p "$HPP:16385" -d "$IX_SHARE" -- '
modprobe rds_tcp; touch /mnt/host/tmp/guest-ping-ready
for i in $(seq 150); do [ -e /mnt/host/tmp/host-ping-done ] && break; sleep 1; done
ss -tn | grep -E "State|16385"; for f in /proc/sys/net/rds/tcp/*; do echo "$f = $(cat $f)"; done' & ppid=$!
    for i in $(seq 120); do [ -e "$F/guest-ping-ready" ] && break; kill -0 $ppid 2>/dev/null || break; sleep 1; done
    sleep 2
    ok=0
    for try in 1 2 3; do    # hostfwd can accept before rds_tcp listens
        timeout 90 "$OXRDMA" rds ping 127.0.0.1 --tport "$HPP" -I "${IX_RDS_PING_LOCAL:-127.0.0.0}" -c 5 --timeout 10 \
            >> "$IX_SCN_OUT/host-rds-ping.log" 2>&1 && { ok=1; break; }
        sleep 2
    done
    touch "$F/host-ping-done"; wait $ppid; ix_capture_stop
    if [ $ok = 1 ]; then cell rds-ping/kernel pass "$(grep -m1 'rtt' "$IX_SCN_OUT/host-rds-ping.log")"
    else cell rds-ping/kernel fail "$(tail -1 "$IX_SCN_OUT/host-rds-ping.log")"; fi
else
    cell rds-ping/kernel not-landed "oxrdma rds ping missing"
fi

read -ra SUB <<<"${OX_RDS_CMD:-rds peer}"
CELLS="host-to-guest/ping-256 host-to-guest/ping-8192 guest-to-host/ping-256 guest-to-host/ping-8192
       congestion/host-send congestion/delivered-in-order restart/host-to-guest restart/guest-to-host"
if ! ix_landed "${SUB[@]}"; then
    for c in $CELLS; do cell "$c" not-landed "oxrdma ${SUB[*]} missing"; done; exit 0
fi
HP=${IX_RDS_HP:-26385} N=${IX_RDS_N:-50} CONG_N=${IX_RDS_CONG_N:-300} CONG_GAP=${IX_RDS_CONG_GAP:-0.015}
rm -f "$F"/host-* "$F"/guest-*
peer=("$OXRDMA" "${SUB[@]}" --connect "127.0.0.1:$HP" --local 10.0.2.2 --remote 10.0.2.15)
pid=""
cleanup() { touch "$F/host-abort"; [ -n "$pid" ] && kill "$pid" 2>/dev/null; ix_capture_stop; }
trap cleanup EXIT
wait_guest() { for i in $(seq "${2:-120}"); do [ -e "$F/guest-$1" ] && return 0; kill -0 $gpid 2>/dev/null || return 1; sleep 1; done; return 1; }
wait_line() {  # wait_line PID LOG REGEX SECS: until LOG has a line matching REGEX (or PID ends)
    for i in $(seq "$(( $4 * 5 ))"); do grep -qE "$3" "$2" 2>/dev/null && return 0; kill -0 "$1" 2>/dev/null || return 1; sleep 0.2; done; return 1
}
hcell() {  # hcell CELL rc log
    if [ "$2" = 0 ]; then cell "$1" pass "$(grep -m1 '^OK' "$3")"; else cell "$1" fail "rc $2: $(grep -m1 -iE 'fail|error' "$3")"; fi
}
mkdir -p "$OXRDMA_PCAP_DIR"
ix_capture_start "$IX_SCN_OUT/rds-host-lo.pcap" "$HP"
log=$IX_SCN_OUT/guest.log
ix_guest "$log" -t $((IX_LIMIT - 30)) -p "$HP:16385" -d "$IX_SHARE" -f "$IX_HERE/guest/rds-host-peer.sh" \
    N="$N" CONG_N="$CONG_N" & gpid=$!
if wait_guest ready 120; then
    sleep 2     # rds_tcp's listener is up once the module is loaded; hostfwd may still race
    # phase 1: the host pings the guest's echo (one process per size)
    for sz in 256 8192; do
        timeout 180 "${peer[@]}" ping --port 4002 --to 4000 --count "$N" --size "$sz" > "$IX_SCN_OUT/host-ping-$sz.log" 2>&1
        hcell "host-to-guest/ping-$sz" $? "$IX_SCN_OUT/host-ping-$sz.log"
    done
    # the guest pings the host's echo
    "${peer[@]}" echo --port 4001 > "$IX_SCN_OUT/host-echo.log" 2>&1 & pid=$!
    wait_line $pid "$IX_SCN_OUT/host-echo.log" '^CONNECTED' 90
    touch "$F/host-echo-up"
    wait_guest pinged 300
    kill "$pid"; wait "$pid" 2>/dev/null; pid=""
    # phase 2: congestion
    timeout 300 "${peer[@]}" send --port 4003 --to 4020 --count "$CONG_N" --size 8192 \
        --interval "$CONG_GAP" > "$IX_SCN_OUT/host-cong.log" 2>&1
    rc=$?
    # The guest's receiver reads only after 8 s with a 64 KiB buffer, so the kernel marks 4020
    # congested at the 9th datagram; the cell wants the kernel's congestion map to have held our
    # sender back. The kernel sends its map from a work queue after the data is in, so a burst
    # (100 x 8 KiB left in 14 ms once, in CI) can be over before the map arrives; paced at
    # CONG_GAP the sends still take ~CONG_N x CONG_GAP s, under the 8 s, if nothing holds them.
    if [ $rc = 0 ] && grep -q 'congested_waits=0 ' "$IX_SCN_OUT/host-cong.log"; then
        cell congestion/host-send fail "the kernel's congestion map never held a send back: $(grep -m1 '^OK' "$IX_SCN_OUT/host-cong.log")"
    else
        hcell congestion/host-send $rc "$IX_SCN_OUT/host-cong.log"
    fi
    touch "$F/host-cong-sent"
    wait_guest cong-done 300
    # phase 3: a new host process (a restart) pings the guest, then echoes its pings
    "${peer[@]}" --echo 4001 --hold-until "$F/guest-done" --hold-timeout 200 \
        ping --port 4002 --to 4000 --count "$N" --size 256 > "$IX_SCN_OUT/host-restart.log" 2>&1 & pid=$!
    if wait_line $pid "$IX_SCN_OUT/host-restart.log" '^(OK|FAIL)' 180 && grep -q '^OK' "$IX_SCN_OUT/host-restart.log"; then
        hcell restart/host-to-guest 0 "$IX_SCN_OUT/host-restart.log"
    else
        hcell restart/host-to-guest 1 "$IX_SCN_OUT/host-restart.log"
    fi
    touch "$F/host-restarted"
    wait_guest done 300
    wait "$pid" 2>/dev/null; pid=""
else
    cell "-" fail "guest never got ready: $(tail -2 "$log" | tr '\n' ' ')"
fi
touch "$F/host-finished"
wait $gpid
cells_from_log "$log"
