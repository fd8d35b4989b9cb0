/*
 * nfsload: the workloads of interop/ganesha-compare.sh, on libnfs's synchronous API (one call
 * at a time, NFSv3 over TCP), so that every server is driven by the same independent client.
 *
 *   nfsload URL write NAME MIB   create NAME, write MIB MiB sequentially, close
 *   nfsload URL read NAME        read NAME sequentially to its end
 *   nfsload URL small N          N x (create, write 100 bytes, close), then N x stat,
 *                                then N x remove
 *
 * URL is an NFS URL of the export, e.g. nfs://127.0.0.1/export?nfsport=2049&mountport=20048.
 * Prints one line per phase: "PHASE SECONDS RATE UNIT". Exit status 1 on any failure.
 * Build: cc -O2 -o nfsload nfsload.c -lnfs (Debian: libnfs-dev).
 */
#include <fcntl.h>
#include <sys/time.h>
#include <nfsc/libnfs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(struct nfs_context *nfs, const char *what)
{
	fprintf(stderr, "nfsload: %s: %s\n", what, nfs_get_error(nfs));
	exit(1);
}

static uint64_t chunk(uint64_t max)
{
	/* The server's rtmax/wtmax, at most 1 MiB (what a Linux client uses by default). */
	return max == 0 || max > (1u << 20) ? (1u << 20) : max;
}

static void do_write(struct nfs_context *nfs, const char *name, long mib)
{
	struct nfsfh *fh;
	uint64_t step = chunk(nfs_get_writemax(nfs));
	uint64_t total = (uint64_t)mib << 20, off = 0;
	char *buf = malloc(step);
	memset(buf, 0x5a, step);
	double t0 = now();
	if (nfs_open2(nfs, name, O_WRONLY | O_CREAT | O_TRUNC, 0644, &fh) != 0)
		die(nfs, "open for writing");
	while (off < total) {
		uint64_t n = total - off < step ? total - off : step;
		int w = nfs_pwrite(nfs, fh, off, n, buf);
		if (w <= 0)
			die(nfs, "write");
		off += (uint64_t)w;
	}
	/* libnfs sends a COMMIT for a file written UNSTABLE when it is closed. */
	if (nfs_fsync(nfs, fh) != 0)
		die(nfs, "fsync");
	if (nfs_close(nfs, fh) != 0)
		die(nfs, "close");
	double s = now() - t0;
	printf("write %.3f %.1f MB/s\n", s, (double)total / s / 1e6);
	free(buf);
}

static void do_read(struct nfs_context *nfs, const char *name)
{
	struct nfsfh *fh;
	uint64_t step = chunk(nfs_get_readmax(nfs)), off = 0;
	char *buf = malloc(step);
	double t0 = now();
	if (nfs_open(nfs, name, O_RDONLY, &fh) != 0)
		die(nfs, "open for reading");
	for (;;) {
		int r = nfs_pread(nfs, fh, off, step, buf);
		if (r < 0)
			die(nfs, "read");
		if (r == 0)
			break;
		off += (uint64_t)r;
	}
	nfs_close(nfs, fh);
	double s = now() - t0;
	printf("read %.3f %.1f MB/s (%llu bytes)\n", s, (double)off / s / 1e6,
	       (unsigned long long)off);
	free(buf);
}

static void do_small(struct nfs_context *nfs, long n)
{
	char name[64], data[100];
	struct nfs_stat_64 st;
	memset(data, 'x', sizeof data);
	double t0 = now();
	for (long i = 0; i < n; i++) {
		struct nfsfh *fh;
		snprintf(name, sizeof name, "small.%ld", i);
		if (nfs_creat(nfs, name, 0644, &fh) != 0)
			die(nfs, "create");
		if (nfs_write(nfs, fh, sizeof data, data) != (int)sizeof data)
			die(nfs, "write");
		if (nfs_close(nfs, fh) != 0)
			die(nfs, "close");
	}
	double t1 = now();
	for (long i = 0; i < n; i++) {
		snprintf(name, sizeof name, "small.%ld", i);
		if (nfs_stat64(nfs, name, &st) != 0)
			die(nfs, "stat");
		if (st.nfs_size != sizeof data) {
			fprintf(stderr, "nfsload: %s has %llu bytes, not 100\n", name,
				(unsigned long long)st.nfs_size);
			exit(1);
		}
	}
	double t2 = now();
	for (long i = 0; i < n; i++) {
		snprintf(name, sizeof name, "small.%ld", i);
		if (nfs_unlink(nfs, name) != 0)
			die(nfs, "remove");
	}
	double t3 = now();
	printf("create %.3f %.1f files/s\n", t1 - t0, n / (t1 - t0));
	printf("stat %.3f %.1f files/s\n", t2 - t1, n / (t2 - t1));
	printf("remove %.3f %.1f files/s\n", t3 - t2, n / (t3 - t2));
	printf("small %.3f %.1f files/s\n", t3 - t0, n / (t3 - t0));
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: nfsload URL write NAME MIB | read NAME | small N\n");
		return 2;
	}
	struct nfs_context *nfs = nfs_init_context();
	if (nfs == NULL) {
		fprintf(stderr, "nfsload: no libnfs context\n");
		return 1;
	}
	struct nfs_url *url = nfs_parse_url_dir(nfs, argv[1]);
	if (url == NULL)
		die(nfs, "URL");
	if (nfs_mount(nfs, url->server, url->path) != 0)
		die(nfs, "mount");
	if (!strcmp(argv[2], "write") && argc == 5)
		do_write(nfs, argv[3], atol(argv[4]));
	else if (!strcmp(argv[2], "read") && argc == 4)
		do_read(nfs, argv[3]);
	else if (!strcmp(argv[2], "small") && argc == 4)
		do_small(nfs, atol(argv[3]));
	else {
		fprintf(stderr, "nfsload: unknown workload\n");
		return 2;
	}
	nfs_destroy_url(url);
	nfs_destroy_context(nfs);
	return 0;
}
