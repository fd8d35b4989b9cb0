#!/bin/bash
# `oxrdma conform` (the RPC-over-RDMA conformance suite, issue 19) from the host against the
# kernel nfsd in the guest over RDMA (oxrdma soft-iWARP <-> siw), and against our own
# `oxrdma nfs serve` on the host, so both tables land side by side.
# limit: 420
# ci: no
#
# Guest: nfsd-serve-host.sh (nfsd with `rdma 20049`, mountd on 20048, no baseline) with
# MKFILE=conform.dat, a 64 KiB file the NFS READ cases read. Host reaches it through port
# forwards: RDMA 127.0.0.1:$FR -> 20049, MOUNT 127.0.0.1:$FM -> 20048.
# Host commands:
#   oxrdma conform rdma://127.0.0.1:FR --mount 127.0.0.1:FM --export /export --nfs-file conform.dat --junit kernel.xml
#   oxrdma conform rdma://127.0.0.1:P --mount 127.0.0.1:T --nfs-file conform.dat --junit oxrdma.xml
# Cells:
#   conform/kernel-nfsd: pass when the suite ran to its table and the cases that failed are
#     exactly the kernel deviations recorded in interop/WIRE-NOTES.md (KERNEL_DEVIATIONS below);
#     a new failure, or a recorded one that passes now, fails the cell with the difference.
#   conform/oxrdma-server: pass when every case passes (ours: each deviation gets fixed).
# Tables: conform-kernel.txt, conform-oxrdma.txt; JUnit: kernel.xml, oxrdma.xml; captures:
# conform-host-lo.pcap (tcpdump on the host's lo), oxrdma-pcap/ (our requester's own).
. "$(dirname "$0")/../lib/common.sh"
FR=${IX_CONFORM_FR:-22049} FM=${IX_CONFORM_FM:-22048}
# The kernel's failing cases, each in interop/WIRE-NOTES.md ("oxrdma conform against Linux nfsd").
KERNEL_DEVIATIONS=${IX_CONFORM_KERNEL_DEVIATIONS-v1-discard-short v1-err-chunk-nomsg v1-err-chunk-xid nfs-reply-chunk-length}
landed=1; ix_landed conform || landed=0
failed_ids() { awk 'NR>2 && $2=="FAIL" {print $1}' "$1" | sort | tr '\n' ' ' | sed 's/ $//'; }
summary() { tail -1 "$1"; }

# Ours first: no guest needed.
if [ $landed = 1 ]; then
    exp=$IX_SCN_OUT/oxrdma-export; mkdir -p "$exp"
    head -c 65536 /dev/urandom > "$exp/conform.dat"; chmod 644 "$exp/conform.dat"
    slog=$IX_SCN_OUT/oxrdma-serve.log
    "$OXRDMA" nfs serve "$exp" --listen 127.0.0.1 --rdma 127.0.0.1:0 --tcp 127.0.0.1:0 \
        --no-portmap --no-rpcbind --no-control --no-nfs4 > "$slog" 2>&1 & spid=$!
    for i in $(seq 50); do grep -q '^ADDRS' "$slog" && break; sleep 0.2; done
    rdma=$(grep -m1 -o 'rdma=rdma://[0-9.:]*' "$slog" | cut -d/ -f3)
    tcp=$(grep -m1 -o 'nfs=tcp://[0-9.:]*' "$slog" | cut -d/ -f3)
    if [ -n "$rdma" ] && [ -n "$tcp" ]; then
        timeout 120 "$OXRDMA" conform "rdma://$rdma" --mount "$tcp" --nfs-file conform.dat \
            --junit "$IX_SCN_OUT/oxrdma.xml" > "$IX_SCN_OUT/conform-oxrdma.txt" 2> "$IX_SCN_OUT/conform-oxrdma.err"
        rc=$?
        f=$(failed_ids "$IX_SCN_OUT/conform-oxrdma.txt")
        if [ $rc = 0 ] && [ -z "$f" ]; then cell conform/oxrdma-server pass "$(summary "$IX_SCN_OUT/conform-oxrdma.txt")"
        else cell conform/oxrdma-server fail "rc $rc; failed: ${f:-none} $(tail -1 "$IX_SCN_OUT/conform-oxrdma.err")"; fi
    else
        cell conform/oxrdma-server fail "oxrdma nfs serve did not start: $(tail -1 "$slog")"
    fi
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
fi

rm -f "$IX_SHARE/tmp/nfs-guest-ready" "$IX_SHARE/tmp/nfs-host-done"
log=$IX_SCN_OUT/guest.log
wait_s=$([ $landed = 1 ] && echo 300 || echo 1)
trap 'touch "$IX_SHARE/tmp/nfs-host-done"; ix_capture_stop' EXIT
ix_capture_start "$IX_SCN_OUT/conform-host-lo.pcap" "$FR" "$FM"
ix_guest "$log" -t $((IX_LIMIT - 60)) -d "$IX_SHARE" -p "$FR:20049" -p "$FM:20048" \
    -f "$IX_HERE/guest/nfsd-serve-host.sh" WAIT="$wait_s" BASELINE=0 MKFILE=conform.dat & gpid=$!
if [ $landed = 1 ]; then
    for i in $(seq 120); do [ -e "$IX_SHARE/tmp/nfs-guest-ready" ] && break; kill -0 $gpid 2>/dev/null || break; sleep 1; done
    mkdir -p "$OXRDMA_PCAP_DIR"
    out=$IX_SCN_OUT/conform-kernel.txt
    timeout 180 "$OXRDMA" conform "rdma://127.0.0.1:$FR" --mount "127.0.0.1:$FM" --export /export \
        --nfs-file conform.dat --junit "$IX_SCN_OUT/kernel.xml" > "$out" 2> "$IX_SCN_OUT/conform-kernel.err"
    rc=$?
    f=$(failed_ids "$out")
    want=$(tr ' ' '\n' <<<"$KERNEL_DEVIATIONS" | sed '/^$/d' | sort | tr '\n' ' ' | sed 's/ $//')
    if ! grep -q 'pass, .* fail, .* not applicable' "$out"; then
        cell conform/kernel-nfsd fail "rc $rc, no table: $(tail -1 "$IX_SCN_OUT/conform-kernel.err")"
    elif [ "$f" = "$want" ]; then
        cell conform/kernel-nfsd pass "$(summary "$out"); failing = the recorded deviations: ${f:-none}"
    else
        cell conform/kernel-nfsd fail "$(summary "$out"); failing: ${f:-none}; recorded: ${want:-none}"
    fi
else
    cell conform/oxrdma-server not-landed "oxrdma conform missing"
    cell conform/kernel-nfsd not-landed "oxrdma conform missing"
fi
touch "$IX_SHARE/tmp/nfs-host-done"
wait $gpid
ix_capture_stop
for t in oxrdma kernel; do [ -r "$IX_SCN_OUT/conform-$t.txt" ] && { ix_log "conform table ($t):"; sed 's/^/    /' "$IX_SCN_OUT/conform-$t.txt" | while IFS= read -r l; do ix_log "$l"; done; }; done
