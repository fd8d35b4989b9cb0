#!/bin/bash
# pynfs (the Linux NFS community's NFSv4.1 server suite, ../shared/thirdparty/pynfs) against the
# guest's kernel nfsd and against `oxrdma nfs serve` on the host, both during one guest boot,
# both over TCP; then the list of tests that nfsd passes and oxrdma does not.
# limit: 1800
# ci: no
#
# The guest runs nfsd (guest/nfsd-serve-host.sh, /export on tmpfs, exported `insecure` to
# 10.0.0.0/8); the host reaches its port 2049 through the forward 127.0.0.1:$FT. The host's
# server exports a fresh directory under $IX_SCN_OUT. pynfs runs its whole `all` set (OXRDMA_PYNFS_
# TESTS overrides) against each, the two at the same time, with --maketree --rundeps.
# Cells: nfsd and oxrdma (pass when the suite ran; the note gives pass/fail/warn counts),
# parity (pass when every test nfsd passes, oxrdma passes too, but for the groups oxrdma leaves
# out by design, delegations and extended attributes, which the note lists apart).
# Needs python3 with ply (Debian python3-ply): otherwise every cell is skip.
. "$(dirname "$0")/../lib/common.sh"
FT=${IX_PYNFS_FT:-21250}
TESTS=${OXRDMA_PYNFS_TESTS:-all}
PYNFS_SRC=${OXRDMA_PYNFS:-$IX_TOP/../shared/thirdparty/pynfs}
PY=
for p in python3 /usr/bin/python3; do "$p" -c 'import ply' 2>/dev/null && { PY=$(command -v "$p"); break; }; done
if [ -z "$PY" ] || [ ! -e "$PYNFS_SRC/nfs4.1/testserver.py" ]; then
    why=$([ -z "$PY" ] && echo "no python3 with ply (python3-ply)" || echo "no pynfs tree at $PYNFS_SRC")
    for c in nfsd oxrdma parity; do cell "$c" skip "$why"; done
    exit 0
fi
ix_landed nfs serve || { for c in nfsd oxrdma parity; do cell "$c" not-landed "oxrdma nfs serve missing"; done; exit 0; }

# Build pynfs in a writable copy; its setup.py runs `python3` from PATH for each part.
work=$IX_SCN_OUT/pynfs
rm -rf "$work"; mkdir -p "$work/bin"
cp -r "$PYNFS_SRC" "$work/src"; chmod -R u+w "$work/src"
ln -sf "$PY" "$work/bin/python3"
export PATH="$work/bin:$PATH"
(cd "$work/src" && python3 setup.py build) > "$work/build.log" 2>&1 ||
    { for c in nfsd oxrdma parity; do cell "$c" fail "pynfs build failed (see $work/build.log)"; done; exit 0; }

rm -f "$IX_SHARE/tmp/nfs-guest-ready" "$IX_SHARE/tmp/nfs-host-done"
log=$IX_SCN_OUT/guest.log
srv_pid=
trap 'touch "$IX_SHARE/tmp/nfs-host-done"; [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null' EXIT
ix_guest "$log" -t $((IX_LIMIT - 30)) -d "$IX_SHARE" -p "$FT:2049" \
    -f "$IX_HERE/guest/nfsd-serve-host.sh" WAIT=$((IX_LIMIT - 120)) BASELINE=0 GRACE=10 & gpid=$!

# The host's server, on an ephemeral port (its ADDRS line tells which).
export_dir=$IX_SCN_OUT/oxrdma-export
mkdir -p "$export_dir"
"$OXRDMA" nfs serve "$export_dir" --tcp 127.0.0.1:0 --no-rdma --no-portmap --nfs4-grace 0 \
    > "$IX_SCN_OUT/oxrdma-serve.log" 2>&1 & srv_pid=$!
ox_addr=
for i in $(seq 30); do
    ox_addr=$(sed -n 's/^ADDRS nfs=tcp:\/\/\([^ ]*\).*/\1/p' "$IX_SCN_OUT/oxrdma-serve.log")
    [ -n "$ox_addr" ] && break; sleep 1
done
for i in $(seq 300); do [ -e "$IX_SHARE/tmp/nfs-guest-ready" ] && break; kill -0 $gpid 2>/dev/null || break; sleep 1; done

run_pynfs() { # NAME SERVER/PATH
    (cd "$work/src/nfs4.1" && timeout $((IX_LIMIT - 240)) python3 testserver.py "$2" --maketree --rundeps \
        $TESTS) > "$work/$1.out" 2>&1
}
pids=()
# nfsd's grace period (GRACE=10 above) must be over before pynfs makes its tree.
sleep 12
if [ -e "$IX_SHARE/tmp/nfs-guest-ready" ]; then run_pynfs nfsd "127.0.0.1:$FT/export" & pids+=($!)
else cell nfsd fail "guest nfsd never became ready: $(tail -2 "$log" | tr '\n' ' ')"; fi
if [ -n "$ox_addr" ]; then run_pynfs oxrdma "$ox_addr/" & pids+=($!)
else cell oxrdma fail "oxrdma nfs serve printed no ADDRS: $(tail -2 "$IX_SCN_OUT/oxrdma-serve.log" | tr '\n' ' ')"; fi
for p in "${pids[@]}"; do wait "$p"; done
touch "$IX_SHARE/tmp/nfs-host-done"
wait $gpid

# Counts per server (pynfs's own "Of those:" line) and the parity list, from the per-test
# result lines ("CODE  st_file.testName  : PASS|FAILURE|WARNING|...").
python3 - "$work" "$IX_SCN_OUT/cells.tsv" <<'PY'
import os, re, sys
work, cells = sys.argv[1], sys.argv[2]
line = re.compile(r"^(\S+)\s+st_\S+\s+:\s+([A-Z ]+?)\s*$")
def load(name):
    p = os.path.join(work, name + ".out")
    if not os.path.exists(p):
        return None, ""
    text = open(p, errors="replace").read()
    res = {m.group(1): m.group(2) for m in map(line.match, text.splitlines()) if m}
    summary = re.search(r"Of those: .*", text)
    return (res or None), (summary.group(0) if summary else "no summary line")
out = open(cells, "a")
have = {}
for name in ("nfsd", "oxrdma"):
    r, summary = load(name)
    have[name] = r
    if r is None:
        out.write(f"{name}\tfail\tno results (see pynfs/{name}.out)\n")
    else:
        out.write(f"{name}\tpass\t{summary}\n")
a, b = have["nfsd"], have["oxrdma"]
if a is None or b is None:
    out.write("parity\tfail\tone of the two runs gave no results\n")
else:
    # Groups oxrdma leaves out by design (what crates/oxrdma/tests/pynfs.rs leaves out too):
    # they are listed, not counted against parity.
    by_design = {"DELEG": "delegations, never granted (OPEN_DELEGATE_NONE)",
                 "XATT": "RFC 8276 extended attributes (NFS4ERR_NOTSUPP)"}
    group = lambda c: next((g for g in by_design if c.startswith(g)), None)
    diff = sorted(c for c, v in a.items() if v == "PASS" and b.get(c) != "PASS")
    worse = [c for c in diff if group(c) is None]
    left = [c for c in diff if group(c) is not None]
    better = sorted(c for c, v in b.items() if v == "PASS" and a.get(c) != "PASS")
    note = (f"{len(worse)} tests nfsd passes and oxrdma does not: {' '.join(worse) or '-'}; "
            f"oxrdma passes {len(better)} that nfsd does not: {' '.join(better) or '-'}")
    if left:
        groups = sorted({group(c) for c in left})
        note += (f"; not implemented by design ({'; '.join(by_design[g] for g in groups)}): "
                 f"{' '.join(left)}")
    out.write(f"parity\t{'pass' if not worse else 'fail'}\t{note}\n")
PY
grep -E '^(nfsd|oxrdma|parity)\b' "$IX_SCN_OUT/cells.tsv" | while IFS=$'\t' read -r n s note; do ix_log "  cell $n: $s ($note)"; done
