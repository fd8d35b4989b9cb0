#!/bin/bash
# Kernel NFSv4.0/4.1/4.2 client (guest) -> `oxrdma nfs serve` (host), over RDMA (siw <-> oxrdma
# iWARP) and TCP; fcntl locks between two client instances; and the NFSv4.1/RDMA cold read pair
# (kernel nfsd vs oxrdma nfs serve, both in one guest).
# limit: 1200
# ci: no
#
# Host: oxrdma nfs serve DIR --rdma 127.0.0.1:$RP --tcp 127.0.0.1:$TP --nfs4-grace 0
# (a fresh server answers OPEN with NFS4ERR_GRACE for its grace period, 90 s by default; with
# no earlier run there is nothing to reclaim, so the grace period is 0).
# Cells (the guest mounts 10.0.2.2:/, guest/nfs4-client.sh):
#   rdma/v4.0 tcp/v4.0         vers=4.0 (RFC 7530: SETCLIENTID, OPEN_CONFIRM, seqids; the
#                              callback path is never opened, no delegations): as below
#   rdma/v4.1 tcp/v4.1 rdma/v4.2 tcp/v4.2   vers=4.x,proto=rdma|tcp,port=RP|TP: the
#                              nfs-roundtrip.sh matrix (0 B..IX_NFS_MB MiB bit-exact, ls, mkdir,
#                              rename, symlink, rm) and the vers= the mount shows
#   rdma/no-vers tcp/no-vers   proto=rdma|tcp,port=RP|TP: the client picks 4.2
#   lock/two-clients           client A mounts over RDMA, client B over TCP from another UTS
#                              namespace (another hostname, so another co_ownerid): two nfs_clients
#   lock/setlk-conflict        A holds lockf(LOCK_EX); B's LOCK_EX|LOCK_NB fails (EAGAIN/EACCES)
#   lock/setlkw-waits          B's blocking LOCK_EX is still waiting 5 s later
#   lock/setlkw-gets-on-release  ... and returns once A unlocks (within IX_NFS4_LOCK_WAIT s)
#   lock/setlk-after-release   A's LOCK_NB fails while B holds the lock, succeeds after B unlocks
#   callback/rdma              a server-to-client RPC CALL of the callback program (CB_NULL or
#                              CB_COMPOUND, RFC 8881 §20) on an RDMA connection: tshark on the
#                              server's own captures of its RDMA connections (oxrdma-pcap/)
#   callback/tcp               the same on a TCP connection: the host's loopback capture when
#                              tcpdump runs, else the server's log of answered callbacks
#   callback/notify-lock       CB_NOTIFY_LOCK answered (the server's log): lock/setlkw-* woken
# Then, in a second guest run (guest/nfs4-perf-guest.sh):
#   nfs4/kernel-nfsd-read nfs4/oxrdma-serve-read  64 MiB cold read, vers=4.1,proto=rdma
#   ratio/nfs4-read            oxrdma / kernel nfsd (target >= 1.0)
# Not a CI scenario: the round trips alone take several minutes under TCG.
. "$(dirname "$0")/../lib/common.sh"
CELLS="rdma/v4.0 tcp/v4.0 rdma/v4.1 tcp/v4.1 rdma/v4.2 tcp/v4.2 rdma/no-vers tcp/no-vers lock/two-clients
       lock/setlk-conflict lock/setlkw-waits lock/setlkw-gets-on-release lock/setlk-after-release
       callback/rdma callback/tcp callback/notify-lock"
if ! ix_landed nfs serve; then
    for c in $CELLS ratio/nfs4-read; do cell "$c" not-landed "oxrdma nfs serve missing"; done; exit 0
fi
if ! timeout 10 "$OXRDMA" nfs serve --help 2>&1 | grep -q -- --nfs4-grace; then
    for c in $CELLS ratio/nfs4-read; do cell "$c" not-landed "oxrdma nfs serve has no NFSv4 (--nfs4-grace)"; done; exit 0
fi
RP=${IX_NFS_RP:-20049} TP=${IX_NFS_TP:-2049} MB=${IX_NFS_MB:-64}
DIR=$IX_SCN_OUT/export; mkdir -p "$DIR" "$OXRDMA_PCAP_DIR"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; ix_capture_stop; }
trap cleanup EXIT
ix_capture_start "$IX_SCN_OUT/nfs4-host-lo.pcap" "$RP" "$TP"
# The server logs each callback's outcome (transport, CB_NULL or CB_COMPOUND) at info.
RUST_LOG=warn,nfs::nfs4::server::callbacks=info "$OXRDMA" nfs serve "$DIR" --rdma "127.0.0.1:$RP" --tcp "127.0.0.1:$TP" --no-portmap --nfs4-grace 0 \
    > "$IX_SCN_OUT/server.log" 2>&1 &
pids+=($!)
for i in $(seq 50); do ss -Hltn "sport = :$TP" | grep -q . && break; sleep 0.2; done
if ! kill -0 "${pids[0]}" 2>/dev/null; then
    for c in $CELLS; do cell "$c" fail "oxrdma nfs serve exited: $(tail -1 "$IX_SCN_OUT/server.log")"; done
else
    log=$IX_SCN_OUT/guest-client.log
    ix_guest "$log" -t $((IX_LIMIT / 2)) -d "$IX_SHARE" -f "$IX_HERE/guest/nfs4-client.sh" \
        SERVER=10.0.2.2 RP="$RP" TP="$TP" MAXMB="$MB" WAIT="${IX_NFS4_LOCK_WAIT:-60}"
    cells_from_log "$log"
    for c in $CELLS; do
        case $c in callback/*) continue ;; esac
        grep -q "^CELL $c " "$log" || cell "$c" fail "guest gave no result: $(tail -2 "$log" | tr '\n' ' ')"
    done
fi
kill "${pids[0]}" 2>/dev/null; wait "${pids[0]}" 2>/dev/null; pids=()
ix_capture_stop

# Callbacks (RFC 8881 §20): RPC CALLs (msg_type 0) sent by the server (source port the server's)
# on the connection the client opened: over RDMA an RFC 8167 backward call in an RDMAP Send, in
# the server's own captures of its RDMA connections; over TCP a record on the mount's stream.
cbcalls() { # FILE PORT -> "frame xid program procedure" per call
    tshark --disable-protocol tibia -r "$1" -Y "tcp.srcport == $2 && rpc.msgtyp == 0 && nfs.cb" \
        -T fields -E separator=' ' -e frame.number -e rpc.xid -e rpc.program -e rpc.procedure 2>/dev/null
}
cbnote() { # FILE LINE
    set -- "$1" $2
    local what=CB_COMPOUND; [ "$5" = 0 ] && what=CB_NULL
    echo "first: $(basename "$1") frame $2, xid $3, program $4 ($what)"
}
slog=$IX_SCN_OUT/server.log
if ! command -v tshark >/dev/null; then cell callback/rdma skip "tshark not installed"
else
    n=0 first=""
    for f in $(ls "$OXRDMA_PCAP_DIR"/*"-$RP-"*server.pcap 2>/dev/null | sort); do
        cbcalls "$f" "$RP" | sed "s|^|$f |" >> "$IX_SCN_OUT/callbacks-rdma.txt"
    done
    [ -f "$IX_SCN_OUT/callbacks-rdma.txt" ] && n=$(wc -l < "$IX_SCN_OUT/callbacks-rdma.txt")
    if [ "$n" -gt 0 ]; then
        l=$(head -1 "$IX_SCN_OUT/callbacks-rdma.txt")
        cell callback/rdma pass "$n server-to-client callback calls on RDMA connections; $(cbnote "${l%% *}" "${l#* }") (callbacks-rdma.txt)"
    else cell callback/rdma fail "no server-to-client callback call in $(ls "$OXRDMA_PCAP_DIR" 2>/dev/null | grep -c 'server.pcap$') RDMA captures"; fi
fi
cap=$IX_SCN_OUT/nfs4-host-lo.pcap
answered_tcp=$(grep -c 'NFSv4 callback answered.*transport=Tcp' "$slog" 2>/dev/null)
if command -v tshark >/dev/null && [ -s "$cap" ] && cbcalls "$cap" "$TP" > "$IX_SCN_OUT/callbacks-tcp.txt" && [ -s "$IX_SCN_OUT/callbacks-tcp.txt" ]; then
    cell callback/tcp pass "$(wc -l < "$IX_SCN_OUT/callbacks-tcp.txt") server-to-client callback calls on TCP; $(cbnote "$cap" "$(head -1 "$IX_SCN_OUT/callbacks-tcp.txt")")"
elif [ "${answered_tcp:-0}" -gt 0 ]; then
    cell callback/tcp pass "$answered_tcp callbacks answered over TCP (server log; no host capture: $(command -v tcpdump >/dev/null || echo 'tcpdump not installed'))"
else cell callback/tcp fail "no callback answered over TCP (server log) and none in a capture"; fi
nl=$(grep -c 'NFSv4 callback answered.*CB_NOTIFY_LOCK' "$slog" 2>/dev/null)
if [ "${nl:-0}" -gt 0 ]; then
    cell callback/notify-lock pass "$nl CB_NOTIFY_LOCK answered ($(grep -m1 'NFSv4 callback answered.*CB_NOTIFY_LOCK' "$slog" | grep -o 'transport=[A-Za-z]*'))"
else cell callback/notify-lock fail "no CB_NOTIFY_LOCK answered (server log)"; fi

# The read pair, both servers in one guest (uncaptured, like the perf scenario).
log=$IX_SCN_OUT/guest-perf.log
ix_guest "$log" -t $((IX_LIMIT / 3)) -s 2 -d "$IX_SHARE" -f "$IX_HERE/guest/nfs4-perf-guest.sh" MB=64 OX_NFS=1
cells_from_log "$log"
grep -a '^PERF ' "$log" | tr -d '\r' | cut -d' ' -f2- | tr ' ' '\t' > "$IX_SCN_OUT/perf.tsv"
val() { awk -F'\t' -v k="$1" '$1==k {print $2}' "$IX_SCN_OUT/perf.tsv"; }
o=$(val nfs4.read.oxrdma) k=$(val nfs4.read.kernel)
if [ -n "$o" ] && [ -n "$k" ]; then
    cell ratio/nfs4-read pass "oxrdma/kernel = $(awk -v o="$o" -v k="$k" 'BEGIN{printf "%.2f", (k>0)?o/k:0}') ($o vs $k MB/s, 64 MiB cold read, vers=4.1,proto=rdma)"
else cell ratio/nfs4-read skip "a figure is missing (oxrdma '$o', kernel '$k')"; fi
