// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * allreduce_bench: MPI_Allreduce (sum) of floats over doubling sizes, every
 * result checked, reported the way nccl-tests' all_reduce_perf does: time
 * per operation, algorithm bandwidth (bytes / time) and bus bandwidth
 * (algbw * 2 * (n - 1) / n, what each rank's link carries in a ring
 * allreduce, so that it compares with the link's speed whatever n is).
 *
 *   mpirun -np 2 --host A,B allreduce_bench [-b MIN] [-e MAX] [-n ITERS]
 *       [-w WARMUP] [-J FILE]
 *
 * MIN, MAX: sizes in bytes (default 8 and 64M; K, M, G suffixes), doubling.
 * -J FILE: also write the results as JSON (FILE "-" is stdout).
 *
 * Every rank contributes element i = (7 i + 13 rank) mod 1021: small
 * integers, so every sum is exact in float whatever order MPI adds in, and
 * a misplaced, missing or stale element shows. After the timed operations
 * (out of place, so the input stays), each rank compares every element of
 * its result with the expected sum. A wrong element makes the run fail:
 * exit status 1 and a message naming the size, rank and first bad element.
 */
#include <mpi.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATTERN_MOD 1021

struct options {
	size_t min_bytes;
	size_t max_bytes;
	int iters;
	int warmup;
	const char *json_path;
};

struct result {
	size_t bytes;
	size_t count;
	double time_us;		/* per operation, slowest rank */
	double algbw_gbps;	/* GB/s, 1e9 bytes */
	double busbw_gbps;
	long long wrong;	/* wrong elements, summed over ranks */
};

static float pattern(size_t i, int rank)
{
	return (float)((7 * (i % PATTERN_MOD) + 13 * (size_t)rank) % PATTERN_MOD);
}

static float expected_sum(size_t i, int nranks)
{
	float sum = 0;

	for (int r = 0; r < nranks; r++)
		sum += pattern(i, r);
	return sum;
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	switch (*end) {
	case 'G': case 'g': v <<= 10; /* fall through */
	case 'M': case 'm': v <<= 10; /* fall through */
	case 'K': case 'k': v <<= 10; end++; break;
	case '\0': break;
	default: return -1;
	}
	if (*end)
		return -1;
	*out = v;
	return 0;
}

static void usage_exit(int rank)
{
	if (rank == 0)
		fprintf(stderr,
			"usage: allreduce_bench [-b MIN_BYTES] [-e MAX_BYTES] [-n ITERS] [-w WARMUP] [-J JSON_FILE]\n");
	MPI_Finalize();
	exit(2);
}

static void parse_options(int argc, char **argv, int rank, struct options *o)
{
	int c;

	*o = (struct options){ .min_bytes = 8, .max_bytes = 64 << 20, .iters = 20, .warmup = 5 };
	while ((c = getopt(argc, argv, "b:e:n:w:J:h")) != -1) {
		switch (c) {
		case 'b':
			if (parse_size(optarg, &o->min_bytes))
				usage_exit(rank);
			break;
		case 'e':
			if (parse_size(optarg, &o->max_bytes))
				usage_exit(rank);
			break;
		case 'n':
			o->iters = atoi(optarg);
			break;
		case 'w':
			o->warmup = atoi(optarg);
			break;
		case 'J':
			o->json_path = optarg;
			break;
		default:
			usage_exit(rank);
		}
	}
	if (o->min_bytes < sizeof(float) || o->min_bytes > o->max_bytes || o->iters < 1 || o->warmup < 0) {
		if (rank == 0)
			fprintf(stderr, "allreduce_bench: need %zu <= MIN <= MAX, ITERS >= 1, WARMUP >= 0\n",
				sizeof(float));
		usage_exit(rank);
	}
}

/*
 * One size: poison the output (so that an operation which writes nothing
 * fails the check), run the warmup and timed operations, check the last
 * result. Returns the figures all ranks agree on.
 */
static struct result run_size(const float *send, float *recv, size_t count, const struct options *o,
			      int rank, int nranks)
{
	struct result r = { .bytes = count * sizeof(float), .count = count };
	double start, elapsed, slowest;
	long long wrong = 0;
	size_t first_bad = 0;

	for (size_t i = 0; i < count; i++)
		recv[i] = -1.0f;
	for (int i = 0; i < o->warmup; i++)
		MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	MPI_Barrier(MPI_COMM_WORLD);
	start = MPI_Wtime();
	for (int i = 0; i < o->iters; i++)
		MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	elapsed = (MPI_Wtime() - start) / o->iters;
	MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

	for (size_t i = 0; i < count; i++) {
		if (recv[i] != expected_sum(i, nranks)) {
			if (!wrong)
				first_bad = i;
			wrong++;
		}
	}
	if (wrong)
		fprintf(stderr,
			"allreduce_bench: rank %d: %lld of %zu elements wrong at %zu bytes; first at index %zu: got %g, expected %g\n",
			rank, wrong, count, r.bytes, first_bad, recv[first_bad],
			expected_sum(first_bad, nranks));
	MPI_Allreduce(&wrong, &r.wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);

	r.time_us = slowest * 1e6;
	r.algbw_gbps = (double)r.bytes / slowest / 1e9;
	r.busbw_gbps = r.algbw_gbps * 2.0 * (nranks - 1) / nranks;
	return r;
}

static void print_header(int nranks, const struct options *o)
{
	printf("# allreduce_bench: MPI_Allreduce, float, sum, out of place, %d ranks, %d iterations (%d warmup)\n",
	       nranks, o->iters, o->warmup);
	printf("#\n");
	printf("# %10s %12s %8s %6s %10s %8s %8s %8s\n",
	       "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong");
	printf("# %10s %12s %8s %6s %10s %8s %8s %8s\n",
	       "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_row(const struct result *r)
{
	printf("  %10zu %12zu %8s %6s %10.2f %8.3f %8.3f %8lld\n", r->bytes, r->count, "float", "sum",
	       r->time_us, r->algbw_gbps, r->busbw_gbps, r->wrong);
	fflush(stdout);
}

static int write_json(const char *path, const struct result *res, int n, int nranks,
		      const struct options *o, long long wrong, double avg_busbw)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;

	if (!f) {
		fprintf(stderr, "allreduce_bench: %s: %s\n", path, strerror(errno));
		return -1;
	}
	fprintf(f, "{\n  \"benchmark\": \"allreduce_bench\",\n  \"op\": \"MPI_Allreduce\",\n"
		"  \"type\": \"float\",\n  \"redop\": \"sum\",\n  \"ranks\": %d,\n"
		"  \"iterations\": %d,\n  \"warmup\": %d,\n  \"wrong\": %lld,\n"
		"  \"avg_busbw_gbps\": %.6f,\n  \"results\": [\n",
		nranks, o->iters, o->warmup, wrong, avg_busbw);
	for (int i = 0; i < n; i++)
		fprintf(f, "    {\"bytes\": %zu, \"count\": %zu, \"time_us\": %.3f, \"algbw_gbps\": %.6f, "
			"\"busbw_gbps\": %.6f, \"wrong\": %lld}%s\n",
			res[i].bytes, res[i].count, res[i].time_us, res[i].algbw_gbps, res[i].busbw_gbps,
			res[i].wrong, i + 1 < n ? "," : "");
	fprintf(f, "  ]\n}\n");
	if (f != stdout && fclose(f)) {
		fprintf(stderr, "allreduce_bench: %s: %s\n", path, strerror(errno));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct options o;
	struct result res[64];
	int rank, nranks, n = 0, status = 0;
	long long wrong = 0;
	double busbw_sum = 0;
	size_t max_count;
	float *send, *recv;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	parse_options(argc, argv, rank, &o);

	max_count = o.max_bytes / sizeof(float);
	send = malloc(max_count * sizeof(float));
	recv = malloc(max_count * sizeof(float));
	if (!send || !recv) {
		fprintf(stderr, "allreduce_bench: rank %d: cannot allocate 2 x %zu bytes\n", rank, o.max_bytes);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	for (size_t i = 0; i < max_count; i++)
		send[i] = pattern(i, rank);

	if (rank == 0)
		print_header(nranks, &o);
	for (size_t bytes = o.min_bytes; bytes <= o.max_bytes && n < 64; bytes *= 2) {
		res[n] = run_size(send, recv, bytes / sizeof(float), &o, rank, nranks);
		if (rank == 0)
			print_row(&res[n]);
		wrong += res[n].wrong;
		busbw_sum += res[n].busbw_gbps;
		n++;
	}
	if (rank == 0) {
		printf("# Wrong elements       : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    : %.4f GB/s\n", busbw_sum / n);
		if (o.json_path && write_json(o.json_path, res, n, nranks, &o, wrong, busbw_sum / n))
			status = 1;
		if (wrong) {
			fprintf(stderr, "allreduce_bench: FAILED: %lld wrong elements in all (see the rank messages above)\n",
				wrong);
			status = 1;
		}
	}
	MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
	free(send);
	free(recv);
	MPI_Finalize();
	return status;
}
