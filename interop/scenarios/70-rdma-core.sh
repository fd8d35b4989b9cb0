#!/bin/bash
# oxrdma's rdma-core provider (cargo feature `rdma-core`) over the kernel's own RDMA devices:
# the verbs tests (crates/verbs/tests/rdma_core.rs) over kernel siw and over rxe, `oxrdma perf`
# through kernel siw, interop between the rdma-core provider (kernel siw in the guest) and the
# soft-iWARP provider (on the host) in both directions, and the main job on rdma-core: the
# kernel NFS client mounting `oxrdma --provider rdma-core:siw0 nfs serve` over siw.
# limit: 900
# ci: no
#
# Builds both binaries with the feature into $IX_CACHE/rdma-core-target (release; the first
# build takes a few minutes).
. "$(dirname "$0")/../lib/common.sh"
tgt=$IX_CACHE/rdma-core-target
log=$IX_SCN_OUT/guest.log
bin=$IX_SHARE/bin
if ! (cd "$IX_TOP" && cargo build -q --release -p oxrdma --features oxrdma/rdma-core --target-dir "$tgt") >"$IX_SCN_OUT/build.log" 2>&1; then
    cell build fail "cargo build --features rdma-core failed (build.log)"; exit 0
fi
cp "$tgt/release/oxrdma" "$bin/oxrdma-rdma-core"
tb=$(cd "$IX_TOP" && cargo test -q --release -p verbs --features rdma-core --test rdma_core --no-run --target-dir "$tgt" --message-format=json 2>>"$IX_SCN_OUT/build.log" |
    python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="rdma_core": print(m["executable"])' | tail -1)
[ -n "$tb" ] && cp "$tb" "$bin/rdma_core_tests" || { cell build fail "no rdma_core test binary"; exit 0; }
cell build pass "oxrdma and the rdma_core tests with --features rdma-core"
HP=${IX_RC_HP:-20971} FP=${IX_RC_FP:-20972}
# The host's perf ends capture into their own directory: perf traffic is not RPC-over-RDMA.
perfcap=$IX_SCN_OUT/perf-pcap; mkdir -p "$perfcap"; touch "$perfcap/.no-rpcrdma"
OXRDMA_PCAP_DIR=$perfcap timeout $((IX_LIMIT - 30)) "$tgt/release/oxrdma" perf write --listen 127.0.0.1:$HP > "$IX_SCN_OUT/host-soft-server.log" 2>&1 & srv=$!
rm -f "$IX_SHARE/tmp/h2g-ready"; mkdir -p "$IX_SHARE/tmp"
(   for _ in $(seq 1 $((IX_LIMIT - 60))); do [ -f "$IX_SHARE/tmp/h2g-ready" ] && break; sleep 1; done
    sleep 2
    OXRDMA_PCAP_DIR=$perfcap timeout 60 "$tgt/release/oxrdma" perf send --lat --connect 127.0.0.1:$FP -s 4096 -n 300 > "$IX_SCN_OUT/host-to-guest.log" 2>&1
    echo "rc=$?" >> "$IX_SCN_OUT/host-to-guest.log"
) & h2g=$!
ix_guest "$log" -t $((IX_LIMIT - 40)) -s 2 -p "$FP:$FP" -d "$IX_SHARE" -f "$IX_HERE/guest/rdma-core-guest.sh" \
    HOST_SOFT_PORT=$HP H2G_PORT=$FP MB=16
# A guest that never got to its listener (no boot, a port taken) must not leave the host
# waiting for it until the scenario's limit.
[ -f "$IX_SHARE/tmp/h2g-ready" ] || kill $h2g 2>/dev/null
wait $h2g 2>/dev/null; kill $srv 2>/dev/null; wait $srv 2>/dev/null
cells_from_log "$log"
if grep -q '^rc=0' "$IX_SCN_OUT/host-to-guest.log" 2>/dev/null; then
    cell host-soft-to-guest-rdma-core pass "Send latency, soft-iWARP -> kernel siw: $(awk '/^ *4096 /{print "t_typical " $4 " us"}' "$IX_SCN_OUT/host-to-guest.log")"
else cell host-soft-to-guest-rdma-core fail "$(tail -2 "$IX_SCN_OUT/host-to-guest.log" 2>/dev/null | tr '\n' ' ')"; fi
grep -q '^CELL ' "$log" || cell "-" fail "guest gave no results: $(tail -2 "$log" | tr '\n' ' ')"
