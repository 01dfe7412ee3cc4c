#include "comm/nccl/nccl_comm.h"

#include <unistd.h>

#include <cstring>
#include <iostream>

#include "comm/collective_watchdog.h"
#include "core/error.h"

namespace shardlm {

namespace {

const char* elem_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    default: return dtype_safetensors_name(dtype);
  }
}

// The stream's work is done, or NCCL reported an asynchronous error.
class NcclProbe final : public CollectiveProbe {
 public:
  NcclProbe(ncclComm_t comm, cudaEvent_t done) : comm_(comm), done_(done) {}
  CollectivePollResult poll(std::string* error) override {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      *error = str_cat(ncclGetErrorString(r != ncclSuccess ? r : async), " (", ncclGetLastError(comm_), ")");
      return CollectivePollResult::kFailed;
    }
    if (done_ == nullptr) return async == ncclInProgress ? CollectivePollResult::kPending : CollectivePollResult::kDone;
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return CollectivePollResult::kDone;
    if (q == cudaErrorNotReady) return CollectivePollResult::kPending;
    *error = str_cat("CUDA ", cudaGetErrorName(q), ": ", cudaGetErrorString(q));
    return CollectivePollResult::kFailed;
  }
  void abort() noexcept override { ncclCommAbort(comm_); }

 private:
  ncclComm_t comm_;
  cudaEvent_t done_;
};

void cuda_ok(cudaError_t st, const char* what) {
  if (st != cudaSuccess) fail(ErrorCode::kDistributed, "NCCL communicator: ", what, ": ", cudaGetErrorName(st));
}

struct RankPlace {
  char host[64];
  char bus[32];
  int device;
};

}  // namespace

NcclComm::NcclComm(ncclComm_t comm, int rank, int size, int device)
    : comm_(comm), rank_(rank), size_(size), device_(device), timeout_(collective_timeout_from_env()) {
  cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
  cuda_ok(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = own_stream_;
  cuda_ok(cudaStreamCreateWithFlags(&send_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  cuda_ok(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
}

NcclComm::~NcclComm() {
  cudaSetDevice(device_);
  for (Staged& s : staged_) {
    cudaEventSynchronize(s.sent);
    cudaEventDestroy(s.sent);
    cudaFree(s.buffer);
  }
  if (comm_ && !aborted_) ncclCommDestroy(comm_);
  if (scratch_) cudaFree(scratch_);
  if (done_) cudaEventDestroy(done_);
  if (send_stream_) cudaStreamDestroy(send_stream_);
  if (own_stream_) cudaStreamDestroy(own_stream_);
}

void NcclComm::use_stream(cudaStream_t stream) {
  cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
  cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // what was enqueued on the old one comes first
  stream_ = stream;
}

std::unique_ptr<NcclComm> NcclComm::create(MPI_Comm mpi_comm, int device) {
  int rank = 0, size = 1;
  MPI_Comm_rank(mpi_comm, &rank);
  MPI_Comm_size(mpi_comm, &size);
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail(ErrorCode::kDistributed, "rank 0: ncclGetUniqueId failed: ", ncclGetErrorString(r));
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_comm);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // setup returns at once and is watched like any collective
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    fail(ErrorCode::kDistributed, "rank ", rank, " of ", size, ": ncclCommInitRankConfig on GPU ", device,
         " failed: ", ncclGetErrorString(r), "; `shardlm doctor` shows devices and NCCL_* settings");
  std::unique_ptr<NcclComm> out(new NcclComm(comm, rank, size, device));
  NcclProbe probe(comm, nullptr);
  wait_for_collective(probe, {rank, size, str_cat("NCCL communicator setup on GPU ", device)}, out->timeout_);

  // Where every rank is, for the interconnect lines.
  RankPlace me{};
  gethostname(me.host, sizeof me.host - 1);
  cudaDeviceGetPCIBusId(me.bus, sizeof me.bus, device);
  me.device = device;
  std::vector<RankPlace> all(static_cast<size_t>(size));
  MPI_Allgather(&me, sizeof me, MPI_BYTE, all.data(), sizeof me, MPI_BYTE, mpi_comm);
  for (int a = 0; a < size; ++a)
    for (int b = a + 1; b < size; ++b) {
      std::string link;
      if (std::strcmp(all[a].host, all[b].host) != 0) {
        link = str_cat("different hosts (", all[a].host, ", ", all[b].host, "): network (IB/RoCE or sockets)");
      } else if (std::strcmp(all[a].bus, all[b].bus) == 0) {
        link = "same GPU";
      } else {
        int can = 0;
        if (rank == a) cudaDeviceCanAccessPeer(&can, all[a].device, all[b].device);
        link = rank == a ? (can ? "same host, P2P (NVLink or PCIe)" : "same host, no P2P: through host memory (SHM)")
                         : "same host";
      }
      out->links_.push_back(str_cat("rank ", a, " ↔ rank ", b, ": ", link));
    }
  if (rank == 0) {
    int version = 0;
    ncclGetVersion(&version);
    std::cerr << "[nccl] NCCL " << version / 10000 << "." << (version % 10000) / 100 << "." << version % 100 << ", "
              << size << " ranks\n";
    for (const std::string& l : out->links_) std::cerr << "[nccl] " << l << "\n";
  }
  return out;
}

void NcclComm::check(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  abort(what.c_str());
  fail(ErrorCode::kDistributed, "rank ", rank_, " of ", size_, ": ", what, " failed: ", ncclGetErrorString(r), " (",
       ncclGetLastError(comm_), ")");
}

void NcclComm::wait(const std::string& what) {
  if (aborted_) fail(ErrorCode::kDistributed, "rank ", rank_, " of ", size_, ": ", what, ": the communicator was aborted");
  try {
    // A non-blocking communicator may return before the work is on the
    // stream (ncclInProgress): wait for that first, then for the stream.
    NcclProbe enqueued(comm_, nullptr);
    wait_for_collective(enqueued, {rank_, size_, what}, timeout_);
    cuda_ok(cudaEventRecord(done_, stream_), "cudaEventRecord");
    NcclProbe probe(comm_, done_);
    wait_for_collective(probe, {rank_, size_, what}, timeout_);
  } catch (...) {
    aborted_ = true;
    throw;
  }
}

namespace {
ncclDataType_t nccl_type(DType dtype, int rank, const char* op) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    default:
      fail(ErrorCode::kUnsupported, "rank ", rank, ": ", op, " on ", elem_name(dtype),
           " elements: NCCL collectives here take f32, bf16 or f16");
  }
}
}  // namespace

void NcclComm::all_reduce_sum(void* data, size_t count, DType dtype) {
  const std::string what = str_cat("all_reduce_sum(", elem_name(dtype), ", ", count, " elements)");
  check(ncclAllReduce(data, data, count, nccl_type(dtype, rank_, "all_reduce_sum"), ncclSum, comm_, stream_), what);
  wait(what);
}

// Uneven counts (our any-degree TP): one broadcast per rank in a group, which
// NCCL runs as one collective.
void NcclComm::gather_typed(const void* in, void* out, const std::vector<size_t>& counts, ncclDataType_t type,
                            size_t elem_bytes, const char* name) {
  if (counts.size() != static_cast<size_t>(size_))
    fail(ErrorCode::kInternal, "all_gather: ", counts.size(), " counts for ", size_, " ranks");
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::string what = str_cat("all_gather(", name, ", ", total, " elements)");
  check(ncclGroupStart(), what);
  size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    char* dst = static_cast<char*>(out) + offset * elem_bytes;
    check(ncclBroadcast(r == rank_ ? in : dst, dst, counts[r], type, r, comm_, stream_), what);
    offset += counts[r];
  }
  check(ncclGroupEnd(), what);
  wait(what);
}

void NcclComm::all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
  gather_typed(in, out, counts, nccl_type(dtype, rank_, "all_gather"), dtype_size(dtype), elem_name(dtype));
}

void NcclComm::broadcast(void* data, size_t bytes, int root) {
  const std::string what = str_cat("broadcast(", bytes, " bytes from rank ", root, ")");
  check(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), what);
  wait(what);
}

void NcclComm::send(const void* data, size_t bytes, int dst) {
  const std::string what = str_cat("send(", bytes, " bytes to rank ", dst, ")");
  check(ncclSend(data, bytes, ncclUint8, dst, comm_, stream_), what);
  wait(what);
}

void NcclComm::recv(void* data, size_t bytes, int src) {
  const std::string what = str_cat("recv(", bytes, " bytes from rank ", src, ")");
  check(ncclRecv(data, bytes, ncclUint8, src, comm_, stream_), what);
  wait(what);
}

// The bytes are copied to a staging buffer on the send stream, which then
// sends them; staging buffers are freed once their send has completed.
void NcclComm::send_async(const void* data, size_t bytes, int dst) {
  while (!staged_.empty() && cudaEventQuery(staged_.front().sent) == cudaSuccess) {
    cudaEventDestroy(staged_.front().sent);
    cudaFree(staged_.front().buffer);
    staged_.pop_front();
  }
  const std::string what = str_cat("send_async(", bytes, " bytes to rank ", dst, ")");
  Staged s{};
  cuda_ok(cudaMalloc(&s.buffer, bytes == 0 ? 1 : bytes), "cudaMalloc (send_async staging)");
  cuda_ok(cudaEventCreateWithFlags(&s.sent, cudaEventDisableTiming), "cudaEventCreate");
  // The copy waits for what this rank's stream produced.
  cuda_ok(cudaEventRecord(done_, stream_), "cudaEventRecord");
  cuda_ok(cudaStreamWaitEvent(send_stream_, done_, 0), "cudaStreamWaitEvent");
  cuda_ok(cudaMemcpyAsync(s.buffer, data, bytes, cudaMemcpyDeviceToDevice, send_stream_), "cudaMemcpyAsync");
  // `data` may be reused as soon as the copy is done: wait for that much only,
  // never for the send (which waits for dst's recv).
  cuda_ok(cudaEventRecord(s.sent, send_stream_), "cudaEventRecord");
  cuda_ok(cudaEventSynchronize(s.sent), "copy for send_async");
  check(ncclSend(s.buffer, bytes, ncclUint8, dst, comm_, send_stream_), what);
  NcclProbe enqueued(comm_, nullptr);  // the send is on send_stream_ before its event is
  wait_for_collective(enqueued, {rank_, size_, what}, timeout_);
  cuda_ok(cudaEventRecord(s.sent, send_stream_), "cudaEventRecord");
  staged_.push_back(s);
}

void NcclComm::barrier() {
  const std::string what = "barrier";
  check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_), what);
  wait(what);
}

std::unique_ptr<Communicator> NcclComm::split(int color, int key) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t sub = nullptr;
  const std::string what = str_cat("split(color ", color, ", key ", key, ")");
  check(ncclCommSplit(comm_, color, key, &sub, &config), what);
  // Non-blocking: the split is done when the parent is idle and the new
  // communicator's own initialisation has finished; its rank and size are
  // undefined until then (asking early crashed or answered size 1).
  NcclProbe parent(comm_, nullptr);
  wait_for_collective(parent, {rank_, size_, what}, timeout_);
  if (sub == nullptr)
    fail(ErrorCode::kDistributed, "rank ", rank_, " of ", size_, ": ", what, " gave no communicator (NCCL_SPLIT_NOCOLOR?)");
  NcclProbe child(sub, nullptr);
  wait_for_collective(child, {rank_, size_, what + ": the new communicator's setup"}, timeout_);
  int sub_rank = 0, sub_size = 1;
  check(ncclCommUserRank(sub, &sub_rank), what + ": ncclCommUserRank");
  check(ncclCommCount(sub, &sub_size), what + ": ncclCommCount");
  return std::unique_ptr<Communicator>(new NcclComm(sub, sub_rank, sub_size, device_));
}

void NcclComm::abort(const char* what) noexcept {
  if (aborted_ || comm_ == nullptr) return;
  aborted_ = true;
  ncclCommAbort(comm_);
}

}  // namespace shardlm
