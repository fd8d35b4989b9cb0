# interop/lib/common.sh - shared by interop/run, interop/ci.sh and interop/scenarios/*.sh.
# Sourced, not executed.  Every path and knob can be overridden from the environment.
#
#   IX_TOP      repository top (git rev-parse --show-toplevel)
#   VMLAB       the shared vmlab recipe, used in place for run.sh   ($IX_TOP/../shared/vmlab)
#   IX_CACHE    image/tool cache outside the repo                  (/var/cache/oxrdma-vmlab)
#   VMLAB_OUT   built guest image (vmlinux, initrd.cpio)           ($IX_CACHE/out)
#   OXRDMA      the oxrdma binary   (target/release/oxrdma, else target/debug/oxrdma)

IX_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)          # .../interop
IX_TOP=${IX_TOP:-$(git -C "$IX_HERE" rev-parse --show-toplevel 2>/dev/null || (cd "$IX_HERE/.." && pwd))}
VMLAB=${VMLAB:-$IX_TOP/../shared/vmlab}
[ -d "$VMLAB" ] && VMLAB=$(cd "$VMLAB" && pwd)
IX_CACHE=${IX_CACHE:-/var/cache/oxrdma-vmlab}
export VMLAB_OUT=${VMLAB_OUT:-$IX_CACHE/out}
export VMLAB_ACCEL=${VMLAB_ACCEL:-tcg}

ix_log() { printf '[interop %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# ---------------------------------------------------------------- image
# Hash of the recipe inputs that end up in the image; a change triggers an (incremental) rebuild.
ix_recipe_hash() {
    (cd "$VMLAB" && cat build.sh guest/init guest/bin/* 2>/dev/null) | sha256sum | cut -c1-16
}

ix_image_ok() { [ -r "$VMLAB_OUT/vmlinux" ] && [ -r "$VMLAB_OUT/initrd.cpio" ]; }

# ix_image_current: the cached image exists and was built from this recipe (or IX_REBUILD=never).
ix_image_current() {
    local have
    have=$(cat "$VMLAB_OUT/.recipe-hash" 2>/dev/null || true)
    ix_image_ok && { [ "$(ix_recipe_hash)" = "$have" ] || [ "${IX_REBUILD:-auto}" = never ]; }
}

# ix_ensure_image BUDGET_SECS: reuse the cached image or build it within BUDGET_SECS.
# Prints nothing on success; on failure sets IX_SKIP_REASON and returns 1.
ix_ensure_image() {
    local budget=${1:-900} want
    IX_SKIP_REASON=
    if [ ! -x "$VMLAB/run.sh" ]; then IX_SKIP_REASON="vmlab recipe not found at $VMLAB"; return 1; fi
    if ! command -v qemu-system-x86_64 >/dev/null && [ "$(id -u)" != 0 ]; then
        IX_SKIP_REASON="qemu-system-x86_64 missing and not root to install it"; return 1
    fi
    want=$(ix_recipe_hash)
    if ix_image_current; then
        command -v qemu-system-x86_64 >/dev/null || { IX_SKIP_REASON="image present but qemu-system-x86_64 missing"; return 1; }
        return 0
    fi
    if [ "${IX_REBUILD:-auto}" = never ]; then IX_SKIP_REASON="no image at $VMLAB_OUT and IX_REBUILD=never"; return 1; fi
    if [ "$(id -u)" != 0 ]; then IX_SKIP_REASON="no image at $VMLAB_OUT and building needs root (debootstrap)"; return 1; fi
    # quick reachability probe of the Debian archive (build.sh downloads from it)
    local mirror=${MIRROR:-http://deb.debian.org/debian}
    if ! timeout 20 python3 - "$mirror" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/dists/bookworm/Release", timeout=15).read(64)
PY
    then IX_SKIP_REASON="cannot reach $mirror (needed to build the guest image)"; return 1; fi
    # build.sh writes dl/ cache/ build/ next to itself: work on a private copy of the recipe
    local R=$IX_CACHE/recipe t0=$SECONDS rc
    mkdir -p "$IX_CACHE" "$VMLAB_OUT" || { IX_SKIP_REASON="cannot create $IX_CACHE"; return 1; }
    mkdir -p "$R"
    cp -a "$VMLAB/build.sh" "$VMLAB/run.sh" "$R/"
    rm -rf "$R/guest" "$R/tests" "$R/host"; cp -a "$VMLAB/guest" "$VMLAB/tests" "$VMLAB/host" "$R/"
    ix_log "building guest image ($R/build.sh, OUT=$VMLAB_OUT, budget ${budget}s)"
    # apt/dpkg may be busy with someone else's install: wait for the locks (within budget)
    while command -v fuser >/dev/null && fuser /var/lib/dpkg/lock-frontend /var/lib/apt/lists/lock >/dev/null 2>&1 &&
          [ $((SECONDS - t0)) -lt $((budget / 3)) ]; do sleep 3; done
    (cd "$R" && OUT=$VMLAB_OUT timeout -k 10 $((budget - (SECONDS - t0))) ./build.sh) > "$IX_CACHE/build.log" 2>&1
    rc=$?
    if [ $rc != 0 ] || ! ix_image_ok; then
        IX_SKIP_REASON="image build failed (rc $rc${rc/124/, over the ${budget}s budget}); see $IX_CACHE/build.log"
        tail -5 "$IX_CACHE/build.log" >&2
        return 1
    fi
    echo "$want" > "$VMLAB_OUT/.recipe-hash"
    echo "$((SECONDS - t0))" > "$VMLAB_OUT/.build-seconds"
    ix_log "image built in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------- guest helpers
# ix_share_prepare DIR: fill DIR (shared into the guest at /mnt/host) with guest-side tools:
# bin/iwpeer (compiled here against rdma-core headers), bin/pcapture.py, bin/*.sh|py, siw/*.
ix_share_prepare() {
    local d=$1
    mkdir -p "$d/bin" "$d/cap" "$d/tmp"
    cp "$IX_HERE"/guest/*.py "$IX_HERE"/guest/*.sh "$d/bin/" 2>/dev/null
    chmod +x "$d"/bin/* 2>/dev/null
    ix_build_iwpeer "$d/bin/iwpeer" || true
    ix_siw_variants "$d/siw" || true
    if [ -n "${OXRDMA:-}" ] && [ -x "$OXRDMA" ]; then cp "$OXRDMA" "$d/bin/oxrdma"; fi
}

# Compile iwpeer on the host (host and guest are both Debian 12: dynamic linking works).
ix_build_iwpeer() {
    local dst=$1 src=$IX_HERE/guest/iwpeer.c cached=$IX_CACHE/bin/iwpeer
    if [ -x "$cached" ] && [ "$cached" -nt "$src" ]; then cp "$cached" "$dst"; return 0; fi
    if [ ! -e /usr/include/rdma/rdma_cma.h ] || [ ! -e /usr/include/infiniband/verbs.h ]; then
        if [ "$(id -u)" = 0 ] && [ "${IX_NO_APT:-0}" != 1 ]; then
            ix_log "installing librdmacm-dev libibverbs-dev for iwpeer"
            DEBIAN_FRONTEND=noninteractive timeout 300 apt-get -o DPkg::Lock::Timeout=120 install -y -qq \
                --no-install-recommends librdmacm-dev libibverbs-dev gcc libc6-dev >/dev/null 2>&1 || true
        fi
    fi
    mkdir -p "$(dirname "$cached")"
    if gcc -O2 -Wall -Wextra -o "$cached.tmp" "$src" -lrdmacm -libverbs 2>"$IX_CACHE/iwpeer-build.log"; then
        mv "$cached.tmp" "$cached"; cp "$cached" "$dst"; return 0
    fi
    ix_log "iwpeer did not compile (see $IX_CACHE/iwpeer-build.log)"; return 1
}

# kernel siw.ko builds with CRC / peer-to-peer initiator policy (tools/build-siw-variants.sh)
ix_siw_variants() {
    local dst=$1 c=$IX_CACHE/siw-variants
    if [ -d "$IX_CACHE/recipe/dl" ]; then
        timeout 600 "$IX_HERE/tools/build-siw-variants.sh" "$IX_CACHE/recipe" "$c" >"$IX_CACHE/siw-variants.log" 2>&1 ||
            ix_log "siw variants not built (see $IX_CACHE/siw-variants.log)"
    fi
    [ -e "$c/crc/siw.ko" ] && { mkdir -p "$dst"; cp -a "$c"/. "$dst"/; }
}

# ix_guest LOG [run.sh options...] -- runs the vmlab guest, output to LOG (and stdout if IX_VERBOSE=1)
ix_guest() {
    local log=$1; shift
    if [ "${IX_VERBOSE:-0}" = 1 ]; then "$VMLAB/run.sh" "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"
    else "$VMLAB/run.sh" "$@" >>"$log" 2>&1; fi
}

# ---------------------------------------------------------------- oxrdma
ix_find_oxrdma() {
    if [ -n "${OXRDMA:-}" ]; then [ -x "$OXRDMA" ] && return 0; OXRDMA=; return 1; fi
    local b
    for b in "$IX_TOP/target/release/oxrdma" "$IX_TOP/target/debug/oxrdma"; do
        [ -x "$b" ] && { OXRDMA=$b; export OXRDMA; return 0; }
    done
    return 1
}

# ix_landed SUBCOMMAND...: true when `oxrdma help SUBCOMMAND...` succeeds and names it.
# (A stub binary that ignores its arguments exits 0 with no output: that is "not landed".)
ix_landed() {
    [ -n "${OXRDMA:-}" ] && [ -x "$OXRDMA" ] || return 1
    local out last=${*: -1}
    out=$(timeout 10 "$OXRDMA" help "$@" 2>&1) || return 1
    [ -n "$out" ] && grep -qiw -- "$last" <<<"$out"
}

# ---------------------------------------------------------------- results
# cell NAME STATUS [NOTE]   STATUS: pass | fail | skip | not-landed
cell() {
    local n=$1 s=$2; shift 2
    printf '%s\t%s\t%s\n' "$n" "$s" "$*" >> "$IX_SCN_OUT/cells.tsv"
    ix_log "  cell $n: $s${*:+ ($*)}"
}

# harvest "CELL name status note..." lines printed by guest scripts
cells_from_log() {
    local log=$1 prefix=${2:-} n s note
    grep -a '^CELL ' "$log" | tr -d '\r' | while read -r _ n s note; do cell "$prefix$n" "$s" "$note"; done
}

# host-side capture on loopback: ix_capture_start FILE PORT... ; ix_capture_stop
IX_CAP_PIDS=()
ix_capture_start() {
    local f=$1; shift
    local filt="" p
    for p in "$@"; do filt+="${filt:+ or }tcp port $p"; done
    if command -v tcpdump >/dev/null && [ "$(id -u)" = 0 ]; then
        # -B: a 64 MiB kernel buffer; with the default 2 MiB, tcpdump lost segments of a
        # 100 MB/s NFS/RDMA stream (run /tmp/ix-ci1), and MPA without markers cannot resync.
        tcpdump -i lo -B 65536 -s 0 -U -w "$f" "$filt" >/dev/null 2>&1 & IX_CAP_PIDS+=($!)
        sleep 0.5
    fi
}
ix_capture_stop() {
    local p
    for p in "${IX_CAP_PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    IX_CAP_PIDS=()
}

# ix_capture_check FILE: decode FILE with tshark and classify every malformed or error-expert
# frame. Prints one line of key=value pairs:
#   frames malformed odd_chunk tcp_loss ws_reassembly ws_framing ws_bug unexplained lossy_streams
# - Two passes (-2): Wireshark reassembles RPC-over-RDMA Read/Write/Reply chunks into the RPC
#   message only in its second pass (packet-rpcrdma.c), so a one-pass read flags every reduced
#   reply (NFS READ, READLINK) as malformed.
# - odd_chunk: a malformed RPC-over-RDMA frame with a Write list whose chunk length is not a
#   multiple of 4. RFC 8166 §3.4.6.2 forbids writing the XDR pad into the chunk, and Wireshark
#   4.0 puts the chunk data back without restoring it, so the rest of the XDR is misaligned.
#   Kernel nfsd's replies are flagged the same way (interop/WIRE-NOTES.md).
# - tcp_loss: a malformed frame in a TCP stream after tcpdump lost a segment of it ("previous
#   segment not captured") or after TCP retransmitted one. MPA without markers has no way to
#   find its FPDUs again, and Wireshark 4.0 loses them after a retransmitted 45 KB segment on
#   loopback (seen in CI). Such frames count here only when the lab's own framing walk
#   (tools/mpa-dump.py --check: every FPDU of every MPA stream, retransmitted bytes dropped, up
#   to the first bytes the capture itself lost, after which no FPDU can be found again) finds
#   no bad FPDU in the file; otherwise they are unexplained. (CI at ac26471 failed on a host-lo
#   capture that had lost one 65,483-byte segment: the walk went on past the gap and called the
#   rest bad, while our server's own capture of the same connection was clean.)
# - ws_reassembly: a malformed NFS/RPC message that Wireshark rebuilt from RDMA Read chunk
#   fragments ("Reassembled RPCoRDMA fragments") with fragments missing. Seen in CI-like runs on
#   our provider's own captures (oxrdma-pcap/) of the kernel client's 1 MiB WRITEs: 717 of the
#   732 fragments of one Read chunk, 1 of 21 WRITEs, while the tcpdump capture of the same
#   connection decoded every WRITE, our server replied NFS3_OK and the files compared equal.
#   Re-segmenting that capture on FPDU boundaries did not change it. Counted here only when
#   mpa-dump.py --check finds the MPA framing clean, as for tcp_loss.
# - ws_framing: a malformed iWARP DDP/RDMAP frame ("Malformed Packet: IWARP_DDP_RDMAP", an
#   "Unknown N" opcode, "BoundError", "Unreassembled fragment") in a stream with no lost or
#   retransmitted segment: Wireshark 4.0's MPA dissector lost the FPDU boundaries where FPDUs
#   straddle 64 KiB segments (seen in a full run at 0da5cb7, 2026-11-26, on our server's own
#   capture of the kernel client's 1 MiB READs: from one 65,495-byte segment on, every frame
#   decoded as "Atomic Request", "Unknown 13", "Unknown 15"; the one that threw was counted).
#   Counted here only when mpa-dump.py --check walks every FPDU of the file well formed
#   (it did: 1,356 FPDUs, 0 bad), as for tcp_loss; otherwise unexplained.
# - ws_bug: "[Dissector bug, protocol RPCoRDMA: tvbuff.c:748: failed assertion ...]", an
#   assertion inside Wireshark 4.0's RPC-over-RDMA heuristic. In its second pass it fires on the
#   last FPDU of a Send that spans several FPDUs, whatever the Send carries. Kernel siw's Sends
#   hit it as often as ours, and a one-pass read of the same frames finds nothing malformed.
# - unexplained: everything else. A `captures` cell fails when it is not zero. Each is listed in
#   FILE.unexplained (frame number, protocols, expert messages, Info column).
# Captures in a directory holding a `.no-rpcrdma` file are not RPC-over-RDMA (`oxrdma perf`) and
# are decoded with Wireshark's RPCoRDMA dissector off.
ix_capture_check() {
    local f=$1
    # The two-pass decode is the slow part (seconds per 100k frames); the captures cell and the
    # report both ask, so the answer is kept beside the capture.
    if [ -s "$f.check" ] && [ "$f.check" -nt "$f" ]; then cat "$f.check"; return; fi
    ix_capture_check_uncached "$f" | tee "$f.check"
}
ix_capture_check_uncached() {
    local f=$1 r off=()
    : >"$f.unexplained"; : >"$f.lossy"
    # A directory marked .no-rpcrdma holds captures of traffic that is not RPC-over-RDMA
    # (`oxrdma perf`): Wireshark's RPCoRDMA heuristic would claim their Sends and call them
    # malformed, so it is turned off and the iWARP layers alone are checked.
    [ -e "$(dirname "$f")/.no-rpcrdma" ] && off=(--disable-protocol rpcordma)
    r=$(tshark -2 --disable-protocol tibia "${off[@]}" -r "$f" -T fields -E separator='|' -e tcp.stream \
        -e _ws.malformed -e _ws.expert.severity -e rpcordma.writes_count -e rpcordma.rdma_length \
        -e tcp.analysis.lost_segment -e tcp.analysis.retransmission -e tcp.analysis.out_of_order \
        -e frame.number -e frame.protocols -e _ws.expert.message -e rpcordma.fragment.count \
        -e _ws.col.Info 2>/dev/null |
    awk -F'|' -v detail="$f.unexplained" -v lossy_detail="$f.lossy" '
        function show(out) {
            info = $13; for (i = 14; i <= NF; i++) info = info "|" $i
            printf "frame %s stream %s [%s] malformed=\"%s\" expert=\"%s\" info=\"%s\"\n",
                   $9, st, $10, $2, $11, info >> out
        }
        { n++; st = $1
          if ($6 != "" || $7 != "" || $8 != "") lossy[st] = 1
          sev = 0; k = split($3, sv, ","); for (i = 1; i <= k; i++) if (sv[i] + 0 > sev) sev = sv[i] + 0
          if ($2 == "" && sev < 8388608) next          # PI_ERROR = 0x00800000
          mal++
          odd = 0
          if ($4 + 0 > 0) { k = split($5, ln, ","); for (i = 1; i <= k; i++) if ((ln[i] + 0) % 4) odd = 1 }
          if (odd) oddn++
          else if (st in lossy) { lossn++; show(lossy_detail) }
          else if ($12 != "" && $2 ~ /Malformed Packet: (NFS|RPC)/) { reasm++; show(lossy_detail) }
          else if ($2 ~ /Malformed Packet: IWARP_DDP_RDMAP/) { framen++; show(lossy_detail) }
          else if ($2 ~ /Dissector bug, protocol RPCoRDMA/) bugn++
          else { unex++; show(detail) }
        }
        END { printf "frames=%d malformed=%d odd_chunk=%d tcp_loss=%d ws_reassembly=%d ws_framing=%d ws_bug=%d unexplained=%d lossy_streams=%d\n",
                     n, mal, oddn, lossn, reasm, framen, bugn, unex, length(lossy) }')
    eval "local $r"
    if [ $((tcp_loss + ws_reassembly + ws_framing)) != 0 ] && grep -q iwarp_mpa "$f.lossy"; then
        local walk
        if ! walk=$(python3 "$IX_HERE/tools/mpa-dump.py" --check "$f" 2>&1); then
            # Our own framing walk finds the stream broken too: not Wireshark's problem.
            sed 's/^/(mpa-dump.py found bad framing) /' "$f.lossy" >>"$f.unexplained"
            echo "$walk" >>"$f.unexplained"
            unexplained=$((unexplained + tcp_loss + ws_reassembly + ws_framing)); tcp_loss=0; ws_reassembly=0; ws_framing=0
        fi
    fi
    echo "frames=$frames malformed=$malformed odd_chunk=$odd_chunk tcp_loss=$tcp_loss ws_reassembly=$ws_reassembly ws_framing=$ws_framing ws_bug=$ws_bug unexplained=$unexplained lossy_streams=$lossy_streams"
}

# ix_captures_cell DIR: one `captures` cell for the captures under DIR (pass when no malformed
# frame is left unexplained; skip without tshark or captures).
ix_captures_cell() {
    local d=$1 f r tot=0 mal=0 odd=0 loss=0 reasm=0 framing=0 bug=0 unex=0 bad=""
    command -v tshark >/dev/null || { cell captures skip "tshark not installed"; return 0; }
    local caps; caps=$(find "$d" -name '*.pcap' -size +24c 2>/dev/null | sort)
    [ -n "$caps" ] || { cell captures skip "no captures"; return 0; }
    for f in $caps; do
        r=$(ix_capture_check "$f")
        eval "local $r"
        tot=$((tot + frames)); mal=$((mal + malformed)); odd=$((odd + odd_chunk))
        loss=$((loss + tcp_loss)); reasm=$((reasm + ws_reassembly)); framing=$((framing + ${ws_framing:-0})); bug=$((bug + ws_bug)); unex=$((unex + unexplained))
        if [ "$unexplained" != 0 ]; then
            bad+=" $(basename "$f"):$unexplained"
            [ -s "$f.unexplained" ] && bad+=" (first: $(head -1 "$f.unexplained"))"
        fi
    done
    local note="$(wc -w <<<"$caps") pcaps, $tot frames, malformed $mal (odd-length Write chunk, a Wireshark limit: $odd; after a lost or retransmitted TCP segment: $loss; Wireshark Read-chunk reassembly: $reasm; Wireshark MPA framing: $framing; Wireshark RPCoRDMA assertion: $bug; unexplained: $unex)"
    if [ "$unex" = 0 ]; then cell captures pass "$note"; else cell captures fail "$note;$bad"; fi
}

# tshark summary of one capture: protocol hierarchy + classified malformed count (+ MPA CRC check)
ix_capture_summary() {
    local f=$1
    [ -s "$f" ] || return 0
    echo "--- $(basename "$(dirname "$f")")/$(basename "$f")"
    if command -v tshark >/dev/null; then
        # tibia: Wireshark's game dissector claims tcp/7171 (and our test ports must not be it)
        tshark --disable-protocol tibia -r "$f" -q -z io,phs 2>/dev/null | grep -v -e '^=' -e '^Filter:' -e '^ *$' | head -12 | sed 's/^/    /'
        echo "    $(ix_capture_check "$f")"
        [ -s "$f.unexplained" ] && head -5 "$f.unexplained" | sed 's/^/    unexplained: /'
    else
        echo "    (tshark not installed: no summary)"
    fi
    if case $f in *siw*|*iwarp*) true ;; *) false ;; esac; then
        local crcbad
        crcbad=$(python3 "$IX_HERE/tools/mpa-dump.py" "$f" 2>/dev/null | grep -c 'CRC MISMATCH')
        echo "    MPA CRC mismatches (tools/mpa-dump.py): $crcbad"
    fi
}
