#include "comm/mpi_comm.h"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"

#ifdef SHARDLM_HAVE_MPI
#include <mpi.h>
#endif

namespace shardlm {

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

#ifdef SHARDLM_HAVE_MPI

namespace {

void check_mpi(int rc, const char* what, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ErrorCode::kDistributed, "rank ", rank, ": ", what, " failed: ", std::string(text, len));
}

// MPI counts are int: move large buffers in pieces of at most 1 GiB.
constexpr size_t kMaxPiece = size_t{1} << 30;

// How a rank waits for a collective (SHARDLM_COLLECTIVE_WAIT): OpenMPI's
// blocking calls poll without pause ("spin", the default: the lowest latency
// when every rank has its own cores); "passive" polls a nonblocking call for
// a few microseconds, then sleeps between polls, so a rank that waits for a
// slower one gives its CPU back. That matters where CPU time is shared or
// rationed: ranks oversubscribing cores, or one held to a CPU quota (a
// cgroup), whose spinning would spend its quota waiting.
bool passive_collective_wait() {
  static const bool passive = [] {
    const char* v = std::getenv("SHARDLM_COLLECTIVE_WAIT");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "spin") == 0) return false;
    if (std::strcmp(v, "passive") == 0) return true;
    fail(ErrorCode::kInvalidArgument, "SHARDLM_COLLECTIVE_WAIT='", v, "': use spin or passive");
  }();
  return passive;
}

// Completes `request`: polled for ~20 us, then with sleeps growing from 5 us
// to 100 us between polls (passive), or by MPI_Wait (spin). In spin mode the
// collectives keep OpenMPI's blocking (tuned) calls; receives wait here.
void wait_for(MPI_Request* request, MPI_Status* status, const char* what, int rank) {
  if (!passive_collective_wait()) return check_mpi(MPI_Wait(request, status), what, rank);
  using namespace std::chrono_literals;
  const auto spin_until = std::chrono::steady_clock::now() + 20us;
  auto pause = 5us;
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(request, &done, status), what, rank);
    if (done) return;
    if (std::chrono::steady_clock::now() < spin_until) continue;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, 100us);
  }
}

class MpiComm final : public Communicator {
 public:
  explicit MpiComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as codes and become exceptions naming this rank;
    // a dead peer is noticed by mpirun, which stops every rank.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Asynchronous sends still moving: their receivers will post them (the
    // protocol is in order), or a failure has already aborted the job.
    for (auto& p : pending_) MPI_Waitall(static_cast<int>(p.requests.size()), p.requests.data(), MPI_STATUSES_IGNORE);
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  using Communicator::all_gather;
  using Communicator::all_reduce_sum;

  void all_reduce_sum(void* data, size_t count, DType dtype) override {
    if (dtype != DType::kF32) {
      // MPI has no half types: sum in f32 and round once (as LocalComm does).
      std::vector<float> wide(count);
      for (size_t i = 0; i < count; ++i) wide[i] = load_as_f32(data, dtype, i);
      all_reduce_sum(wide.data(), count, DType::kF32);
      for (size_t i = 0; i < count; ++i) store_from_f32(data, dtype, i, wide[i]);
      return;
    }
    float* f = static_cast<float*>(data);
    for (size_t off = 0; off < count; off += kMaxPiece / sizeof(float)) {
      int n = static_cast<int>(std::min(count - off, kMaxPiece / sizeof(float)));
      if (!passive_collective_wait()) {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, f + off, n, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce", rank_);
        continue;
      }
      MPI_Request request;
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, f + off, n, MPI_FLOAT, MPI_SUM, comm_, &request), "MPI_Iallreduce", rank_);
      wait_for(&request, MPI_STATUS_IGNORE, "MPI_Iallreduce", rank_);
    }
  }

  void all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) override {
    SHARDLM_CHECK(static_cast<int>(counts.size()) == size_);
    const size_t esize = dtype_size(dtype);
    std::vector<int> recv_counts(size_), displs(size_);
    size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      SHARDLM_CHECK(counts[r] * esize <= static_cast<size_t>(INT_MAX) && offset <= static_cast<size_t>(INT_MAX),
                    "all_gather of more than 2 GiB");
      recv_counts[r] = static_cast<int>(counts[r] * esize);
      displs[r] = static_cast<int>(offset);
      offset += counts[r] * esize;
    }
    const void* send = in == static_cast<char*>(out) + displs[rank_] ? MPI_IN_PLACE : in;
    if (!passive_collective_wait()) {
      check_mpi(MPI_Allgatherv(send, recv_counts[rank_], MPI_BYTE, out, recv_counts.data(), displs.data(), MPI_BYTE,
                               comm_),
                "MPI_Allgatherv", rank_);
      return;
    }
    MPI_Request request;
    check_mpi(MPI_Iallgatherv(send, recv_counts[rank_], MPI_BYTE, out, recv_counts.data(), displs.data(), MPI_BYTE,
                              comm_, &request),
              "MPI_Iallgatherv", rank_);
    wait_for(&request, MPI_STATUS_IGNORE, "MPI_Iallgatherv", rank_);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    auto* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < bytes; off += kMaxPiece) {
      int n = static_cast<int>(std::min(bytes - off, kMaxPiece));
      if (!passive_collective_wait()) {
        check_mpi(MPI_Bcast(p + off, n, MPI_BYTE, root, comm_), "MPI_Bcast", rank_);
        continue;
      }
      MPI_Request request;
      check_mpi(MPI_Ibcast(p + off, n, MPI_BYTE, root, comm_, &request), "MPI_Ibcast", rank_);
      wait_for(&request, MPI_STATUS_IGNORE, "MPI_Ibcast", rank_);
    }
  }

  void send(const void* data, size_t bytes, int dst) override {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t off = 0; off < bytes || off == 0; off += kMaxPiece) {
      int n = static_cast<int>(std::min(bytes - off, kMaxPiece));
      check_mpi(MPI_Send(p + off, n, MPI_BYTE, dst, 0, comm_), "MPI_Send", rank_);
      if (bytes == 0) break;
    }
  }

  void send_async(const void* data, size_t bytes, int dst) override {
    reap_sends();
    PendingSend p;
    const auto* b = static_cast<const uint8_t*>(data);
    p.bytes.assign(b, b + bytes);
    for (size_t off = 0; off < bytes || off == 0; off += kMaxPiece) {
      int n = static_cast<int>(std::min(bytes - off, kMaxPiece));
      MPI_Request request;
      check_mpi(MPI_Isend(p.bytes.data() + off, n, MPI_BYTE, dst, 0, comm_, &request), "MPI_Isend", rank_);
      p.requests.push_back(request);
      if (bytes == 0) break;
    }
    pending_.push_back(std::move(p));
  }

  void recv(void* data, size_t bytes, int src) override {
    auto* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < bytes || off == 0; off += kMaxPiece) {
      int n = static_cast<int>(std::min(bytes - off, kMaxPiece));
      MPI_Status status;
      MPI_Request request;
      check_mpi(MPI_Irecv(p + off, n, MPI_BYTE, src, 0, comm_, &request), "MPI_Irecv", rank_);
      wait_for(&request, &status, "MPI_Irecv", rank_);
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      if (got != n) fail(ErrorCode::kDistributed, "rank ", rank_, " expected ", n, " bytes from rank ", src, ", got ", got);
      if (bytes == 0) break;
    }
  }

  void barrier() override {
    if (!passive_collective_wait()) return check_mpi(MPI_Barrier(comm_), "MPI_Barrier", rank_);
    MPI_Request request;
    check_mpi(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier", rank_);
    wait_for(&request, MPI_STATUS_IGNORE, "MPI_Ibarrier", rank_);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split", rank_);
    return std::make_unique<MpiComm>(sub, true);
  }

  void abort(const char* what) noexcept override {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    std::fprintf(stderr, "shardlm: rank %d failed: %s\n", world_rank, what);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  // A send_async in flight: the copy MPI reads from, and its pieces' requests.
  struct PendingSend {
    std::vector<uint8_t> bytes;
    std::vector<MPI_Request> requests;
  };
  // Drops the sends that completed (testing them also moves MPI's progress).
  void reap_sends() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      check_mpi(MPI_Testall(static_cast<int>(it->requests.size()), it->requests.data(), &done, MPI_STATUSES_IGNORE),
                "MPI_Testall", rank_);
      it = done ? pending_.erase(it) : it + 1;
    }
  }

  MPI_Comm comm_;
  bool owned_;
  std::vector<PendingSend> pending_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (rc != MPI_SUCCESS) fail(ErrorCode::kDistributed, "MPI_Init_thread failed (code ", rc, ")");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    fail(ErrorCode::kUnsupported, "this MPI library gives thread level ", provided, ", below MPI_THREAD_SERIALIZED (",
         MPI_THREAD_SERIALIZED, ") which serve's engine thread needs; use an OpenMPI built with thread support");
  }
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiRuntime::world() { return make_mpi_world_comm(); }

std::unique_ptr<Communicator> make_mpi_world_comm() { return std::make_unique<MpiComm>(MPI_COMM_WORLD, false); }

#endif  // SHARDLM_HAVE_MPI

}  // namespace shardlm
