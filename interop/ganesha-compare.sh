#!/bin/bash
# Compare `oxrdma nfs serve` with nfs-ganesha (FSAL VFS) over NFSv3 on TCP, both driven by the
# same independent client (libnfs, through interop/tools/nfsload.c), in a network namespace
# of their own (loopback only) with a private /run, so that ganesha's rpcbind registration
# meets neither the host's rpcbind nor another ganesha.
#
# Workloads (issue 23): 1 GiB sequential write (then COMMIT), 1 GiB sequential read of that
# file (warm: it is in the page cache for both servers), and a small-file workload (2,000 x
# create, write 100 bytes, close; then 2,000 x stat; then 2,000 x remove). libnfs's
# synchronous API keeps one call in flight. Runs alternate between the servers (ganesha
# first in odd runs, oxrdma first in even ones); keep RUNS even, so that each goes first as
# often (in one 3-run invocation on tmpfs the first server of every run wrote 1 GiB faster).
# The summary gives medians with their range and the ratio oxrdma / ganesha of the medians
# (>1: oxrdma faster).
#
# Usage: interop/ganesha-compare.sh   (as root)
# Environment: OXRDMA (default target/release/oxrdma), RUNS (4), SIZE_MIB (1024), FILES (2000),
# BASE (/var/tmp: where the two export directories go, on the same file system).
# Needs: root, ip netns, unshare, rpcbind, ganesha.nfsd with libfsalvfs (Debian: nfs-ganesha,
# nfs-ganesha-vfs), cc and libnfs-dev. Skips with the reason when one is missing.
set -u
here=$(cd "$(dirname "$0")" && pwd)

skip() {
	echo "ganesha-compare: skipped: $*"
	exit 0
}

if [ "${1:-}" = "--inner" ]; then
	# Inside the namespace: $2 is the work directory.
	work=$2
	set -e
	mount -t tmpfs tmpfs /run
	mkdir -p /run/rpcbind /run/ganesha
	rpcbind -f -w &
	rpcbind_pid=$!
	ganesha_pid=
	ox_pid=
	stop() {
		[ -n "$ox_pid" ] && kill "$ox_pid" 2>/dev/null
		[ -n "$ganesha_pid" ] && kill "$ganesha_pid" 2>/dev/null
		kill "$rpcbind_pid" 2>/dev/null
		wait 2>/dev/null
	}
	trap stop EXIT
	sleep 0.5
	cat > "$work/ganesha.conf" <<EOF
NFS_CORE_PARAM {
    Protocols = 3;
    NFS_Port = 2049;
    MNT_Port = 20048;
    Enable_RQUOTA = false;
    Enable_NLM = false;
}
NFSV4 {
    # No grace period: during one ganesha answers a size change with NFS3ERR_JUKEBOX.
    Graceless = true;
}
EXPORT {
    Export_Id = 1;
    Path = $work/g;
    Pseudo = /g;
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = 3;
    Transports = TCP;
    FSAL { Name = VFS; }
}
EOF
	ganesha.nfsd -F -f "$work/ganesha.conf" -L "$work/ganesha.log" -p /run/ganesha/ganesha.pid -N NIV_EVENT &
	ganesha_pid=$!
	"$OXRDMA" nfs serve "$work/o" --tcp 127.0.0.1:3049 --mount-port 3050 --export /o \
		--no-rdma --no-portmap --no-rpcbind --no-control > "$work/oxrdma.log" 2>&1 &
	ox_pid=$!
	set +e
	# NFSv3 MNT of a ganesha export takes its Path, not its Pseudo path.
	url_g="nfs://127.0.0.1$work/g?nfsport=2049&mountport=20048"
	url_o="nfs://127.0.0.1/o?nfsport=3049&mountport=3050"
	# Both must answer a mount before the runs start (ganesha takes a few seconds).
	for s in g o; do
		url=url_$s
		for _ in $(seq 1 60); do
			"$work/nfsload" "${!url}" small 1 > /dev/null 2>&1 && break
			sleep 1
		done
		"$work/nfsload" "${!url}" small 1 > /dev/null || {
			echo "ganesha-compare: the $s server does not answer; its log:"
			tail -20 "$work/ganesha.log" "$work/oxrdma.log" 2>/dev/null
			exit 1
		}
	done
	for run in $(seq 1 "$RUNS"); do
		if [ $((run % 2)) = 1 ]; then order="g o"; else order="o g"; fi
		for s in $order; do
			url=url_$s
			name=$([ $s = g ] && echo ganesha || echo oxrdma)
			w=$("$work/nfsload" "${!url}" write big "$SIZE_MIB") || exit 1
			r=$("$work/nfsload" "${!url}" read big) || exit 1
			rm -f "$work/$s/big"
			sm=$("$work/nfsload" "${!url}" small "$FILES") || exit 1
			echo "$w" | awk -v n=$name -v r=$run '{print r, n, "write_MBps", $3}'
			echo "$r" | awk -v n=$name -v r=$run '{print r, n, "read_MBps", $3}'
			echo "$sm" | awk -v n=$name -v r=$run '{print r, n, $1"_files_per_s", $3}'
		done
	done
	exit 0
fi

[ "$(id -u)" = 0 ] || skip "needs root (network and mount namespaces)"
for t in ip unshare rpcbind ganesha.nfsd cc awk; do
	command -v $t > /dev/null || skip "no $t"
done
ls /usr/lib/*/ganesha/libfsalvfs.so > /dev/null 2>&1 || skip "no ganesha FSAL VFS (nfs-ganesha-vfs)"
[ -e /usr/include/nfsc/libnfs.h ] || skip "no libnfs headers (libnfs-dev)"
OXRDMA=${OXRDMA:-$here/../target/release/oxrdma}
[ -x "$OXRDMA" ] || skip "no oxrdma binary at $OXRDMA (cargo build --release -p oxrdma, or set OXRDMA)"
export OXRDMA RUNS=${RUNS:-4} SIZE_MIB=${SIZE_MIB:-1024} FILES=${FILES:-2000}

work=$(mktemp -d "${BASE:-/var/tmp}/oxrdma-gc.XXXXXX")
mkdir -p "$work/g" "$work/o"
cc -O2 -o "$work/nfsload" "$here/tools/nfsload.c" -lnfs || skip "cannot build nfsload.c"
ns=oxrdma-gc-$$
ip netns add $ns || skip "cannot make a network namespace"
cleanup() {
	ip netns del $ns 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
ip netns exec $ns ip link set lo up
echo "ganesha-compare: $(ganesha.nfsd -v 2>&1 | head -1 | tr -s ' '); oxrdma $OXRDMA;" \
	"runs $RUNS, $SIZE_MIB MiB, $FILES files, load $(cut -d' ' -f1-3 /proc/loadavg)"
ip netns exec $ns unshare -m --propagation private bash "$0" --inner "$work" | tee "$work/results"
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
# Medians with their range, and oxrdma / ganesha.
awk '
{ v[$2" "$3] = v[$2" "$3] " " $4; keys[$3] = 1 }
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	lo = a[1]; hi = a[n]
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
END {
	for (k in keys) {
		g = median(v["ganesha " k]); glo = lo; ghi = hi
		o = median(v["oxrdma " k]); olo = lo; ohi = hi
		printf "%-22s ganesha %9.1f [%.1f-%.1f]  oxrdma %9.1f [%.1f-%.1f]  oxrdma/ganesha %.2f\n", k, g, glo, ghi, o, olo, ohi, o / g
	}
}' "$work/results" | sort
