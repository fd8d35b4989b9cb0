#!/bin/bash
# Kernel NFSv3 client (guest) writing to `oxrdma nfs serve` (host) while the server is stopped
# with SIGTERM and started again (same ports, same --state-dir), over RDMA and TCP.
# limit: 900
# ci: no
#
# Cells:
#   rdma/sigterm-restart  vers=3,proto=rdma: the guest writes 64 MiB with dd (conv=fsync); once
#                         the host sees a quarter of it in the export, it sends SIGTERM; the
#                         clean shutdown answers the calls under way and drops the others, the
#                         next instance (same write verifier) gets the client's retransmissions;
#                         pass = the file reads back bit-exact after a cold remount, the
#                         restart happened during the write, and the first instance's log has
#                         its per-transport shutdown lines with the RPC-over-RDMA drain clean
#   tcp/sigterm-restart   the same over vers=3,proto=tcp
# The servers run with --shutdown-grace 60: the kernel client keeps tens of 1 MiB WRITEs in
# flight, whose Read chunks a debug build under TCG pulls at a few MiB/s (with the default 10 s
# the first run left 13 of 49 calls unpulled, and said so).
. "$(dirname "$0")/../lib/common.sh"
CELLS="rdma/sigterm-restart tcp/sigterm-restart"
if ! ix_landed nfs serve; then
    for c in $CELLS; do cell "$c" not-landed "oxrdma nfs serve missing"; done; exit 0
fi
RP=${IX_NFS_RP:-20049} TP=${IX_NFS_TP:-2049}
DIR=$IX_SCN_OUT/export; STATE=$IX_SCN_OUT/state; mkdir -p "$DIR" "$STATE"
pidf=$IX_SCN_OUT/server.pid
cleanup() { [ -f "$pidf" ] && kill "$(cat "$pidf")" 2>/dev/null; jobs -p | xargs -r kill 2>/dev/null; }
trap cleanup EXIT
serve() {  # serve LOG: start an instance, wait until it listens
    "$OXRDMA" -v nfs serve "$DIR" --rdma "127.0.0.1:$RP" --tcp "127.0.0.1:$TP" --no-portmap \
        --no-rpcbind --no-control --state-dir "$STATE" --shutdown-grace 60 >"$1" 2>&1 &
    echo $! >"$pidf"
    for i in $(seq 100); do ss -Hltn "sport = :$TP" | grep -q . && return 0; sleep 0.1; done
    return 1
}
restart_when() {  # restart_when FILE BYTES N: SIGTERM once FILE has BYTES, then serve again
    local f=$1 want=$2 n=$3
    for i in $(seq 3000); do
        [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" -ge "$want" ] && break; sleep 0.1
    done
    local size; size=$(stat -c %s "$f" 2>/dev/null || echo 0)
    kill -TERM "$(cat "$pidf")"
    while kill -0 "$(cat "$pidf")" 2>/dev/null; do sleep 0.05; done
    echo "restarted at $size bytes" >"$IX_SCN_OUT/restart-$n.txt"
    serve "$IX_SCN_OUT/server-$n-after.log"
}
MB=${IX_NFS_MB:-64}
for proto in rdma tcp; do
    c=$proto/sigterm-restart; n=${c//\//-}
    if [ $proto = rdma ]; then opts="vers=3,proto=rdma,port=$RP,mountport=$TP,mountproto=tcp,nolock"
    else opts="vers=3,proto=tcp,port=$TP,mountport=$TP,mountproto=tcp,nolock"; fi
    if ! serve "$IX_SCN_OUT/server-$n-before.log"; then
        cell "$c" fail "oxrdma nfs serve did not start: $(tail -1 "$IX_SCN_OUT/server-$n-before.log")"; continue
    fi
    restart_when "$DIR/restart-$n" $((MB * 1048576 / 4)) "$n" &
    watcher=$!
    log=$IX_SCN_OUT/guest-$n.log
    ix_guest "$log" -t 600 -d "$IX_SHARE" -f "$IX_HERE/guest/nfs-restart.sh" \
        SERVER=10.0.2.2 OPTS="$opts" CELL="$c" MB="$MB" SIW=1
    kill $watcher 2>/dev/null; wait $watcher 2>/dev/null
    kill -TERM "$(cat "$pidf")" 2>/dev/null; while kill -0 "$(cat "$pidf")" 2>/dev/null; do sleep 0.05; done
    before=$IX_SCN_OUT/server-$n-before.log
    lines=$(grep -a 'oxrdma: shutdown: \(rdma\|tcp\):' "$before" | sed 's/oxrdma: shutdown: //' | tr '\n' ';')
    if ! grep -aq "^CELL $c pass" "$log"; then
        cells_from_log "$log"
        grep -aq "^CELL $c" "$log" || cell "$c" fail "guest gave no result: $(tail -2 "$log" | tr '\n' ' ')"
    elif [ ! -f "$IX_SCN_OUT/restart-$n.txt" ]; then
        cell "$c" fail "the server was not restarted during the write"
    elif grep -aq 'not drained\|NOT finished' "$before"; then
        cell "$c" fail "the shutdown did not drain: $(grep -a 'not drained\|NOT finished' "$before" | head -1)"
    else
        cell "$c" pass "$(cat "$IX_SCN_OUT/restart-$n.txt"); $MB MiB bit-exact; shutdown: $lines"
    fi
done
