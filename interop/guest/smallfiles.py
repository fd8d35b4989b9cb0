#!/usr/bin/env python3
# smallfiles.py (guest) - the small-file workload of issue 23's lab cell: in DIR (made here, on
# an NFS mount), N x create (open O_CREAT|O_EXCL, close), then N x stat, then N x remove, each
# phase timed on its own (CLOCK_MONOTONIC).  Before the create and the stat phase, untimed: sync
# and `echo 3 > /proc/sys/vm/drop_caches`, so the stat phase finds no dentry or attribute cached
# and asks the server (a LOOKUP per file) instead of answering from the client's caches; the
# remove phase then finds the dentries the stat phase made (a REMOVE per file).
# One process does all the calls: a fork per file (`touch`, `stat`) costs more than the call
# itself under TCG.
# usage: smallfiles.py DIR N  ->  prints "SMALL create_s stat_s remove_s" (exit 1 on an error), and
# on stderr the NFSv3 calls each phase made (the client's /proc/net/rpc/nfs counters)
import os
import sys
import time


PROC3 = ("null getattr setattr lookup access readlink read write create mkdir symlink mknod "
         "remove rmdir rename link readdir readdirplus fsstat fsinfo pathconf commit").split()


def proc3():
    """The kernel NFS client's NFSv3 call counts (/proc/net/rpc/nfs), or None."""
    try:
        with open("/proc/net/rpc/nfs") as f:
            for line in f:
                w = line.split()
                if w and w[0] == "proc3":
                    return [int(x) for x in w[2:]]
    except OSError:
        pass
    return None


def calls(name, before, after):
    """Print the NFSv3 calls a phase made (to stderr: not part of the result line)."""
    if before is None or after is None:
        return
    d = [f"{p}={b - a}" for p, a, b in zip(PROC3, before, after) if b != a]
    print(f"calls {name}: {' '.join(d) or 'none'}", file=sys.stderr)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:  # not root: the stat phase may then be served from the client's cache
        print(f"drop_caches: {e}", file=sys.stderr)


def main():
    d, n = sys.argv[1], int(sys.argv[2])
    os.mkdir(d)
    names = [os.path.join(d, f"f{i:05d}") for i in range(n)]
    drop_caches()
    c0 = proc3()
    t0 = time.monotonic()
    for p in names:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    t1 = time.monotonic()
    c1 = proc3()
    drop_caches()
    c2 = proc3()
    t2 = time.monotonic()
    for p in names:
        os.stat(p)
    t3 = time.monotonic()
    c3 = proc3()
    t4 = time.monotonic()
    for p in names:
        os.unlink(p)
    t5 = time.monotonic()
    c4 = proc3()
    calls("create", c0, c1)
    calls("stat", c2, c3)
    calls("remove", c3, c4)
    left = os.listdir(d)
    os.rmdir(d)
    if left:
        print(f"{len(left)} files left after the remove phase", file=sys.stderr)
        return 1
    print(f"SMALL {t1 - t0:.3f} {t3 - t2:.3f} {t5 - t4:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
