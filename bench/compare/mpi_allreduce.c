/*
 * Open MPI side of Loom's side-by-side comparison (bench/compare/compare.py).
 *
 * Times MPI_Allreduce (float sum), MPI_Allgather or MPI_Reduce_scatter_block over a list
 * of sizes, the way nccl-tests times a row: a few warm-up calls, then `iters` back-to-back
 * calls timed as one loop; the per-call time is the loop time / iters, averaged over ranks.
 * Sizes are nccl-tests' "size" column: the whole buffer for all-reduce, the gathered
 * output for all-gather, the input for reduce-scatter (per-rank block = size / nranks).
 * Bus bandwidth uses nccl-tests' factors: 2(n-1)/n for all-reduce, (n-1)/n otherwise.
 *
 * Usage: mpirun -np N mpi_allreduce [--op allreduce|allgather|reducescatter]
 *                                   --sizes BYTES:ITERS[:WARMUP][,...] [--warmup W]
 * (WARMUP, when given for a size, overrides --warmup for that size.)
 * Rank 0 prints one machine-readable line per size:
 *   RESULT <op> <bytes> <count> <iters> <time_us> <algbw_GBps> <busbw_GBps> <wrong>
 * `wrong` counts result elements that differ from the expected value (checked once per
 * size after timing, not inside the timed loop).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum Op { kAllReduce, kAllGather, kReduceScatter };

static const char* opName(enum Op op) {
  switch (op) {
    case kAllReduce: return "allreduce";
    case kAllGather: return "allgather";
    default: return "reducescatter";
  }
}

static void usageExit(int rank, const char* why) {
  if (rank == 0)
    fprintf(stderr,
            "mpi_allreduce: %s\nusage: mpi_allreduce [--op allreduce|allgather|reducescatter]"
            " --sizes BYTES:ITERS[:WARMUP][,...] [--warmup W]\n",
            why);
  MPI_Abort(MPI_COMM_WORLD, 6);
}

/* Input element i of rank r: small integers, so every sum is exact in float. */
static float inputValue(int rank, size_t i) { return (float)((rank + 1) + (int)(i % 7)); }

/* Runs the collective once. `count` is the per-rank block for gather/scatter. */
static void runOnce(enum Op op, float* send, float* recv, size_t count) {
  switch (op) {
    case kAllReduce:
      MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case kAllGather:
      MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case kReduceScatter:
      MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
  }
}

/* Number of result elements on this rank that differ from what the collective must give. */
static long countWrong(enum Op op, const float* recv, size_t count, int rank, int nranks) {
  long wrong = 0;
  size_t n = op == kAllGather ? count * (size_t)nranks : count;
  for (size_t i = 0; i < n; ++i) {
    float want = 0;
    if (op == kAllGather) {
      want = inputValue((int)(i / count), i % count);
    } else {
      size_t global = op == kReduceScatter ? (size_t)rank * count + i : i;
      for (int r = 0; r < nranks; ++r) want += inputValue(r, global);
    }
    if (recv[i] != want) ++wrong;
  }
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  enum Op op = kAllReduce;
  const char* sizes = NULL;
  int warmup = 5;
  for (int a = 1; a < argc; ++a) {
    if (!strcmp(argv[a], "--op") && a + 1 < argc) {
      const char* v = argv[++a];
      if (!strcmp(v, "allreduce")) op = kAllReduce;
      else if (!strcmp(v, "allgather")) op = kAllGather;
      else if (!strcmp(v, "reducescatter")) op = kReduceScatter;
      else usageExit(rank, "unknown --op");
    } else if (!strcmp(argv[a], "--sizes") && a + 1 < argc) {
      sizes = argv[++a];
    } else if (!strcmp(argv[a], "--warmup") && a + 1 < argc) {
      warmup = atoi(argv[++a]);
    } else {
      usageExit(rank, "unknown argument");
    }
  }
  if (!sizes) usageExit(rank, "--sizes is required");

  /* Parse BYTES:ITERS pairs; find the largest size to allocate once. */
  size_t nsizes = 0, maxBytes = 0;
  size_t bytesList[256];
  int itersList[256], warmupList[256];
  for (const char* p = sizes; *p && nsizes < 256;) {
    char* end = NULL;
    unsigned long long b = strtoull(p, &end, 10);
    if (end == p || *end != ':') usageExit(rank, "--sizes wants BYTES:ITERS pairs");
    p = end + 1;
    long it = strtol(p, &end, 10);
    if (end == p || it < 1) usageExit(rank, "--sizes: ITERS must be >= 1");
    bytesList[nsizes] = (size_t)b;
    itersList[nsizes] = (int)it;
    warmupList[nsizes] = -1;
    if (*end == ':') {
      p = end + 1;
      long w = strtol(p, &end, 10);
      if (end == p || w < 0) usageExit(rank, "--sizes: WARMUP must be >= 0");
      warmupList[nsizes] = (int)w;
    }
    if (b > maxBytes) maxBytes = (size_t)b;
    ++nsizes;
    p = *end == ',' ? end + 1 : end;
  }

  size_t maxElems = maxBytes / sizeof(float) + (size_t)nranks;
  float* send = (float*)malloc(maxElems * sizeof(float));
  float* recv = (float*)malloc(maxElems * sizeof(float));
  if (!send || !recv) usageExit(rank, "out of memory");
  memset(recv, 0, maxElems * sizeof(float));

  if (rank == 0) printf("# mpi_allreduce op %s nranks %d warmup %d\n", opName(op), nranks, warmup);
  for (size_t s = 0; s < nsizes; ++s) {
    size_t total = bytesList[s] / sizeof(float); /* nccl-tests' "size" in elements */
    size_t count = op == kAllReduce ? total : total / (size_t)nranks; /* per call */
    if (count == 0) continue;
    size_t inElems = op == kReduceScatter ? count * (size_t)nranks : count;
    for (size_t i = 0; i < inElems; ++i) send[i] = inputValue(rank, i);
    int iters = itersList[s];

    int warm = warmupList[s] >= 0 ? warmupList[s] : warmup;
    for (int w = 0; w < warm; ++w) runOnce(op, send, recv, count);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int it = 0; it < iters; ++it) runOnce(op, send, recv, count);
    double perCall = (MPI_Wtime() - t0) / iters, sum = 0;
    MPI_Allreduce(&perCall, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double sec = sum / nranks;

    /* Re-fill and check once: the timed loop overwrote recv with the same values. */
    memset(recv, 0, (op == kAllGather ? count * (size_t)nranks : count) * sizeof(float));
    runOnce(op, send, recv, count);
    long wrong = countWrong(op, recv, count, rank, nranks), wrongAll = 0;
    MPI_Allreduce(&wrong, &wrongAll, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);

    size_t bytes = total * sizeof(float);
    double algbw = (double)bytes / 1e9 / sec;
    double factor = op == kAllReduce ? 2.0 * (nranks - 1) / nranks : (double)(nranks - 1) / nranks;
    if (rank == 0) {
      printf("RESULT %s %zu %zu %d %.3f %.4f %.4f %ld\n", opName(op), bytes, total, iters,
             sec * 1e6, algbw, algbw * factor, wrongAll);
      fflush(stdout);
    }
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
