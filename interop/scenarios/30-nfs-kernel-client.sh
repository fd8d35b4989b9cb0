#!/bin/bash
# Kernel NFSv3 client (guest) -> `oxrdma nfs serve` (host), over RDMA (siw <-> oxrdma iWARP) and TCP.
# limit: 900
# ci: yes
#
# Host: oxrdma nfs serve DIR --rdma 127.0.0.1:$RP --tcp 127.0.0.1:$TP   (OX_NFS_SERVE_CMD
# overrides "nfs serve"; MOUNT v3 must be answered on the --tcp port, or set OX_NFS_MOUNTPORT).
# Cells (the guest mounts 10.0.2.2:/):
#   rdma/explicit-ports  vers=3,proto=rdma,port=RP,mountport=MP,mountproto=tcp,nolock (no portmapper)
#   tcp/explicit-ports   vers=3,proto=tcp,port=TP,mountport=MP,mountproto=tcp,nolock
#   rdma/portmapper      vers=3,proto=rdma,port=RP,nolock: mount asks the host's portmapper on
#                        111 for MOUNT; runs only as root with --portmap 127.0.0.1:111 and 111 free
# Then a second server from an exports file (`nfs serve --exports`, DIR exported to 127.0.0.1,
# which the guest's connections come from through QEMU's user network, `insecure` since they
# come from unprivileged ports), and the guest mounts a subdirectory of the export, DIR/sub:
#   rdma/exports-subdir  the rdma/explicit-ports options, EXPORT=DIR/sub
#   tcp/exports-subdir   the tcp/explicit-ports options, EXPORT=DIR/sub
#   rdma/v2-enabled-server  the server accepts RPC-over-RDMA versions 1 and 2 (its default;
#                        draft-cel-05): pass = rdma/explicit-ports passed (bit-exact) and the
#                        server's log (-v) shows every kernel connection locked to version 1
. "$(dirname "$0")/../lib/common.sh"
read -ra SUB <<<"${OX_NFS_SERVE_CMD:-nfs serve}"
CELLS="rdma/explicit-ports tcp/explicit-ports rdma/portmapper rdma/v2-enabled-server rdma/exports-subdir tcp/exports-subdir"
if ! ix_landed "${SUB[@]}"; then
    for c in $CELLS; do cell "$c" not-landed "oxrdma ${SUB[*]} missing"; done; exit 0
fi
RP=${IX_NFS_RP:-20049} TP=${IX_NFS_TP:-2049} MP=${OX_NFS_MOUNTPORT:-${IX_NFS_TP:-2049}}
DIR=$IX_SCN_OUT/export; mkdir -p "$DIR" "$OXRDMA_PCAP_DIR"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; ix_capture_stop; }
trap cleanup EXIT
ix_capture_start "$IX_SCN_OUT/nfs-host-lo.pcap" "$RP" "$TP" 111
pm=()
if [ "$(id -u)" = 0 ] && ! ss -Hltn 'sport = :111' | grep -q .; then pm=(--portmap 127.0.0.1:111); fi
"$OXRDMA" -v "${SUB[@]}" "$DIR" --rdma "127.0.0.1:$RP" --tcp "127.0.0.1:$TP" "${pm[@]}" > "$IX_SCN_OUT/server.log" 2>&1 &
pids+=($!)
for i in $(seq 50); do ss -Hltn "sport = :$TP" | grep -q . && break; sleep 0.2; done
if ! kill -0 "${pids[0]}" 2>/dev/null; then
    for c in $CELLS; do cell "$c" fail "oxrdma ${SUB[*]} exited: $(tail -1 "$IX_SCN_OUT/server.log")"; done; exit 1
fi
MB=${IX_NFS_MB:-64}
run_cell() {  # cell opts
    local log=$IX_SCN_OUT/guest-${1//\//-}.log
    ix_guest "$log" -t 400 -d "$IX_SHARE" -f "$IX_HERE/guest/nfs-roundtrip.sh" \
        SERVER=10.0.2.2 EXPORT="${OX_NFS_EXPORT:-/}" OPTS="$2" CELL="$1" MAXMB="$MB" SIW=1
    cells_from_log "$log"
    grep -q "^CELL $1" "$log" || cell "$1" fail "guest gave no result: $(tail -2 "$log" | tr '\n' ' ')"
}
run_cell rdma/explicit-ports "vers=3,proto=rdma,port=$RP,mountport=$MP,mountproto=tcp,nolock"
run_cell tcp/explicit-ports "vers=3,proto=tcp,port=$TP,mountport=$MP,mountproto=tcp,nolock"
v1=$(grep -a -c 'connection speaks version 1' "$IX_SCN_OUT/server.log")
v2=$(grep -a -c 'connection speaks version 2' "$IX_SCN_OUT/server.log")
if ! grep -q $'^rdma/explicit-ports\tpass' "$IX_SCN_OUT/cells.tsv"; then
    cell rdma/v2-enabled-server fail "rdma/explicit-ports did not pass"
elif [ "$v1" -ge 1 ] && [ "$v2" = 0 ]; then
    cell rdma/v2-enabled-server pass "versions 1-2 accepted; $v1 kernel connection(s) in version 1, unchanged, bit-exact"
else
    cell rdma/v2-enabled-server fail "server log: $v1 connection(s) in version 1, $v2 in version 2"
fi
if [ ${#pm[@]} -gt 0 ]; then
    run_cell rdma/portmapper "vers=3,proto=rdma,port=$RP,nolock"
else
    cell rdma/portmapper skip "needs root and a free 127.0.0.1:111 for oxrdma's portmapper"
fi

# The exports-file cells: a subdirectory of an export, as Linux's mountd allows.
kill "${pids[0]}" 2>/dev/null; wait "${pids[0]}" 2>/dev/null
if [ "${SUB[*]}" != "nfs serve" ]; then
    for c in rdma/exports-subdir tcp/exports-subdir; do cell "$c" skip "needs nfs serve --exports"; done; exit 0
fi
EXP=$(realpath "$DIR"); mkdir -p "$EXP/sub"
printf '%s 127.0.0.1(rw,insecure,no_root_squash)\n' "$EXP" > "$IX_SCN_OUT/exports"
"$OXRDMA" nfs serve --exports "$IX_SCN_OUT/exports" --rdma "127.0.0.1:$RP" --tcp "127.0.0.1:$TP" \
    --no-portmap --no-control > "$IX_SCN_OUT/server-exports.log" 2>&1 &
pids=($!)
for i in $(seq 50); do ss -Hltn "sport = :$TP" | grep -q . && break; sleep 0.2; done
if ! kill -0 "${pids[0]}" 2>/dev/null; then
    for c in rdma/exports-subdir tcp/exports-subdir; do
        cell "$c" fail "oxrdma nfs serve --exports exited: $(tail -1 "$IX_SCN_OUT/server-exports.log")"
    done; exit 1
fi
OX_NFS_EXPORT="$EXP/sub"
run_cell rdma/exports-subdir "vers=3,proto=rdma,port=$RP,mountport=$MP,mountproto=tcp,nolock"
run_cell tcp/exports-subdir "vers=3,proto=tcp,port=$TP,mountport=$MP,mountproto=tcp,nolock"
