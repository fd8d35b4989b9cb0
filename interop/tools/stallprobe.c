/*
 * stallprobe: how much of the wall clock a busy thread on this machine actually gets.
 *
 * One thread reads CLOCK_MONOTONIC in a tight loop for SECONDS and counts every gap between two
 * consecutive reads longer than THRESHOLD_US: time in which the thread did not run (preempted
 * by another task, or the whole VM descheduled by its host, which a guest without steal-time
 * accounting does not see as steal). Benchmarks that time short phases on such a machine
 * measure these gaps as much as the code; docs/performance.md says how `nfs bench --rounds`
 * spreads them over both transports.
 *
 *   cc -O2 -o /tmp/stallprobe interop/tools/stallprobe.c
 *   /tmp/stallprobe [SECONDS (5)] [THRESHOLD_US (1000)]
 *
 * Prints one line: gaps over the threshold, their total and share of the run, the longest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 5.0;
	long long threshold = (argc > 2 ? atoll(argv[2]) : 1000) * 1000LL;
	long long run = (long long)(secs * 1e9);
	long long start, prev, longest = 0, lost = 0, gaps = 0;

	if (secs <= 0 || threshold <= 0) {
		fprintf(stderr, "usage: stallprobe [SECONDS] [THRESHOLD_US]\n");
		return 2;
	}
	start = prev = now_ns();
	for (;;) {
		long long t = now_ns();
		long long gap = t - prev;

		if (gap > threshold) {
			gaps++;
			lost += gap;
			if (gap > longest)
				longest = gap;
		}
		prev = t;
		if (t - start >= run)
			break;
	}
	printf("%.1f s: %lld gaps over %lld us, %.3f s in them (%.1f %% of the run), longest %.1f ms\n",
	       (prev - start) / 1e9, gaps, threshold / 1000, lost / 1e9,
	       100.0 * lost / (double)(prev - start), longest / 1e6);
	return 0;
}
