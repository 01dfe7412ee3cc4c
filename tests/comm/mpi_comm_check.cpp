// Runs under mpirun. "collectives": every collective of MpiComm against the
// values it must produce; exit 0 on success. "die": rank 1 exits mid-run.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "comm/mpi_comm.h"
#include "core/error.h"

using namespace shardlm;

static int failures = 0;
#define EXPECT(cond)                                                               \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "rank check failed at line %d: %s\n", __LINE__, #cond); \
      ++failures;                                                                  \
    }                                                                              \
  } while (0)

static void collectives(Communicator& comm) {
  const int r = comm.rank(), n = comm.size();
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r + 1) * static_cast<float>(i);
  comm.all_reduce_sum(v.data(), v.size());
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < v.size(); ++i) EXPECT(v[i] == ranks_sum * static_cast<float>(i));

  std::vector<size_t> counts(n);
  for (int k = 0; k < n; ++k) counts[k] = static_cast<size_t>(k + 2);  // uneven, like vocab shards
  std::vector<float> mine(counts[r], static_cast<float>(r));
  std::vector<float> all(std::accumulate(counts.begin(), counts.end(), size_t{0}));
  comm.all_gather(mine.data(), all.data(), counts);
  size_t off = 0;
  for (int k = 0; k < n; ++k)
    for (size_t j = 0; j < counts[k]; ++j) EXPECT(all[off++] == static_cast<float>(k));

  // bf16: summed in f32, rounded once; gathered as 2-byte elements.
  std::vector<uint16_t> h(300, f32_to_bf16(static_cast<float>(r + 1)));
  comm.all_reduce_sum(h.data(), h.size(), DType::kBF16);
  for (uint16_t x : h) EXPECT(bf16_to_f32(x) == bf16_to_f32(f32_to_bf16(ranks_sum)));
  std::vector<uint16_t> hm(counts[r], f32_to_bf16(static_cast<float>(r)));
  std::vector<uint16_t> hall(all.size());
  comm.all_gather(hm.data(), hall.data(), counts, DType::kBF16);
  off = 0;
  for (int k = 0; k < n; ++k)
    for (size_t j = 0; j < counts[k]; ++j) EXPECT(bf16_to_f32(hall[off++]) == static_cast<float>(k));

  char text[32] = {0};
  if (r == n - 1) std::strcpy(text, "from the last rank");
  comm.broadcast(text, sizeof text, n - 1);
  EXPECT(std::string(text) == "from the last rank");

  if (n >= 2) {  // a ring of sends, like pipeline stages
    std::vector<float> out(64, static_cast<float>(r)), in(64, -1.0f);
    if (r % 2 == 0) {
      comm.send(out.data(), out.size() * sizeof(float), (r + 1) % n);
      comm.recv(in.data(), in.size() * sizeof(float), (r + n - 1) % n);
    } else {
      comm.recv(in.data(), in.size() * sizeof(float), (r + n - 1) % n);
      comm.send(out.data(), out.size() * sizeof(float), (r + 1) % n);
    }
    EXPECT(in[0] == static_cast<float>((r + n - 1) % n));
  }

  // Split into tensor-parallel groups of 2 (as WorldConfig: tp fastest).
  auto tp = comm.split(r / 2, r % 2);
  EXPECT(tp->rank() == r % 2);
  float x = 1.0f;
  tp->all_reduce_sum(&x, 1);
  EXPECT(x == static_cast<float>(tp->size()));
  comm.barrier();
}

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world();
  std::string mode = argc > 1 ? argv[1] : "collectives";
  if (mode == "collectives") {
    collectives(*world);
  } else if (mode == "die") {
    world->barrier();
    if (world->rank() == 1) {
      std::_Exit(3);
    }
    float x = 1.0f;
    world->all_reduce_sum(&x, 1);  // never completes: rank 1 is gone
    return 0;
  }
  if (failures) std::fprintf(stderr, "rank %d: %d checks failed\n", world->rank(), failures);
  return failures ? 1 : 0;
}
