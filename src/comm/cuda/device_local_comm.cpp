#include "comm/cuda/device_local_comm.h"

#include <algorithm>
#include <cstdio>

#include "comm/collective_watchdog.h"
#include "comm/cuda/device_local_sum.h"
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

void cuda_ok(cudaError_t st, int rank, const std::string& what, const char* call) {
  if (st != cudaSuccess)
    fail(ErrorCode::kDistributed, "rank ", rank, ": ", what, ": ", call, " failed: ", cudaGetErrorName(st), " (",
         cudaGetErrorString(st), ")");
}

std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

// ---- group -------------------------------------------------------------------

std::shared_ptr<DeviceLocalGroup> DeviceLocalGroup::create(int n_ranks, int device) {
  return std::shared_ptr<DeviceLocalGroup>(new DeviceLocalGroup(n_ranks, device));
}

DeviceLocalGroup::DeviceLocalGroup(int n_ranks, int device)
    : n_(n_ranks), device_(device), timeout_(collective_timeout_from_env()) {
  if (n_ranks < 1 || n_ranks > 16)
    fail(ErrorCode::kInvalidArgument, "device-local communicator: ", n_ranks, " ranks on one GPU; 1 to 16 are supported");
  cuda_ok(cudaSetDevice(device), 0, "device-local communicator setup", "cudaSetDevice");
  events_.resize(static_cast<size_t>(kPhases * n_));
  for (cudaEvent_t& e : events_)
    cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), 0, "device-local communicator setup",
            "cudaEventCreate");
  ptrs_.assign(n_, nullptr);
  colors_.assign(n_, 0);
  keys_.assign(n_, 0);
  children_.resize(n_);
  mailbox_.resize(static_cast<size_t>(n_ * n_));
}

DeviceLocalGroup::~DeviceLocalGroup() {
  cudaSetDevice(device_);
  for (auto& box : mailbox_)
    for (Message& m : box) {
      cudaEventDestroy(m.ready);
      cudaFree(m.buffer);
    }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

std::unique_ptr<DeviceLocalComm> DeviceLocalGroup::make(int rank) {
  if (rank < 0 || rank >= n_) fail(ErrorCode::kInvalidArgument, "device-local communicator: rank ", rank, " of ", n_);
  return std::unique_ptr<DeviceLocalComm>(new DeviceLocalComm(shared_from_this(), rank));
}

void DeviceLocalGroup::arrive(int rank, const std::string& what) {
  std::unique_lock<std::mutex> lock(mu_);
  auto who = [&] { return str_cat("rank ", rank, " of ", n_, ": ", what); };
  if (!aborted_.empty()) fail(ErrorCode::kDistributed, who(), ": stopped because ", aborted_);
  const uint64_t gen = generation_;
  if (++arrived_ == n_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  const bool met = cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || !aborted_.empty(); });
  if (generation_ != gen) return;
  if (!met) {
    aborted_ = str_cat("rank ", rank, " timed out in ", what);
    cv_.notify_all();
    fail(ErrorCode::kDistributed, who(), " did not complete within ", seconds(timeout_), " s: ", n_ - arrived_,
         " rank(s) never reached it (SHARDLM_COLLECTIVE_TIMEOUT_S sets the limit)");
  }
  fail(ErrorCode::kDistributed, who(), ": stopped because ", aborted_);
}

// ---- communicator ------------------------------------------------------------

DeviceLocalComm::DeviceLocalComm(std::shared_ptr<DeviceLocalGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  cuda_ok(cudaSetDevice(group_->device_), rank_, "device-local communicator", "cudaSetDevice");
  cuda_ok(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), rank_, "device-local communicator",
          "cudaStreamCreate");
  stream_ = own_stream_;
}

DeviceLocalComm::~DeviceLocalComm() {
  if (own_stream_) {
    cudaStreamSynchronize(own_stream_);
    cudaStreamDestroy(own_stream_);
  }
}

void DeviceLocalComm::use_stream(cudaStream_t stream) {
  // Work already enqueued on the old stream comes first.
  cuda_ok(cudaStreamSynchronize(stream_), rank_, "use_stream", "cudaStreamSynchronize");
  stream_ = stream;
}

int DeviceLocalComm::size() const { return group_->n_; }

void DeviceLocalComm::sync_phase(int phase, const std::string& what) {
  DeviceLocalGroup& g = *group_;
  cuda_ok(cudaEventRecord(g.events_[phase * g.n_ + rank_], stream_), rank_, what, "cudaEventRecord");
  g.arrive(rank_, what);
  for (int q = 0; q < g.n_; ++q)
    if (q != rank_)
      cuda_ok(cudaStreamWaitEvent(stream_, g.events_[phase * g.n_ + q], 0), rank_, what, "cudaStreamWaitEvent");
}

void DeviceLocalComm::reduce(void* data, size_t count, DType dtype, const std::string& what) {
  DeviceLocalGroup& g = *group_;
  const int n = g.n_;
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    fail(ErrorCode::kUnsupported, "rank ", rank_, ": ", what, ": the device-local communicator sums f32, bf16 or f16");
  const size_t elem = dtype_size(dtype);
  const int kind = dtype == DType::kF32 ? 0 : dtype == DType::kBF16 ? 1 : 2;
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    g.ptrs_[rank_] = data;
  }
  sync_phase(0, what);  // every rank's input is ready
  std::vector<void*> ptrs;
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    ptrs = g.ptrs_;
  }
  auto lo = [&](int r) { return count * static_cast<size_t>(r) / static_cast<size_t>(n); };
  cuda_ok(device_local_sum(ptrs.data(), n, kind, data, lo(rank_), lo(rank_ + 1), stream_), rank_, what,
          "sum kernel");
  sync_phase(1, what);  // every slice is reduced in its owner's buffer
  for (int q = 0; q < n; ++q) {
    if (q == rank_ || lo(q + 1) == lo(q)) continue;
    cuda_ok(cudaMemcpyAsync(static_cast<char*>(data) + lo(q) * elem, static_cast<char*>(ptrs[q]) + lo(q) * elem,
                            (lo(q + 1) - lo(q)) * elem, cudaMemcpyDeviceToDevice, stream_),
            rank_, what, "cudaMemcpyAsync");
  }
  sync_phase(2, what);  // nobody changes its buffer while another still copies from it
}

void DeviceLocalComm::all_reduce_sum(void* data, size_t count, DType dtype) {
  reduce(data, count, dtype, str_cat("all_reduce_sum(", elem_name(dtype), ", ", count, " elements)"));
}

void DeviceLocalComm::gather(const void* in, void* out, const std::vector<size_t>& counts, size_t elem,
                             const std::string& what) {
  DeviceLocalGroup& g = *group_;
  if (counts.size() != static_cast<size_t>(g.n_))
    fail(ErrorCode::kInternal, "rank ", rank_, ": ", what, ": ", counts.size(), " counts for ", g.n_, " ranks");
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    g.ptrs_[rank_] = const_cast<void*>(in);
  }
  sync_phase(0, what);
  std::vector<void*> ptrs;
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    ptrs = g.ptrs_;
  }
  size_t offset = 0;
  for (int q = 0; q < g.n_; ++q) {
    if (counts[q])
      cuda_ok(cudaMemcpyAsync(static_cast<char*>(out) + offset * elem, ptrs[q], counts[q] * elem,
                              cudaMemcpyDeviceToDevice, stream_),
              rank_, what, "cudaMemcpyAsync");
    offset += counts[q];
  }
  sync_phase(1, what);
}

void DeviceLocalComm::all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
  gather(in, out, counts, dtype_size(dtype), str_cat("all_gather(", elem_name(dtype), ")"));
}

void DeviceLocalComm::broadcast(void* data, size_t bytes, int root) {
  DeviceLocalGroup& g = *group_;
  const std::string what = str_cat("broadcast(", bytes, " bytes from rank ", root, ")");
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    g.ptrs_[rank_] = data;
  }
  sync_phase(0, what);
  void* src = nullptr;
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    src = g.ptrs_[root];
  }
  if (rank_ != root && bytes)
    cuda_ok(cudaMemcpyAsync(data, src, bytes, cudaMemcpyDeviceToDevice, stream_), rank_, what, "cudaMemcpyAsync");
  sync_phase(1, what);
}

// The bytes are staged in a stream-ordered allocation, so `data` may be reused
// at once and a ring of ranks that all send first cannot deadlock.
void DeviceLocalComm::send(const void* data, size_t bytes, int dst) {
  DeviceLocalGroup& g = *group_;
  const std::string what = str_cat("send(", bytes, " bytes to rank ", dst, ")");
  if (dst < 0 || dst >= g.n_ || dst == rank_) fail(ErrorCode::kInternal, "rank ", rank_, ": ", what, ": bad destination");
  DeviceLocalGroup::Message m{nullptr, bytes, nullptr};
  cuda_ok(cudaMallocAsync(&m.buffer, bytes ? bytes : 1, stream_), rank_, what, "cudaMallocAsync");
  if (bytes)
    cuda_ok(cudaMemcpyAsync(m.buffer, data, bytes, cudaMemcpyDeviceToDevice, stream_), rank_, what, "cudaMemcpyAsync");
  cuda_ok(cudaEventCreateWithFlags(&m.ready, cudaEventDisableTiming), rank_, what, "cudaEventCreate");
  cuda_ok(cudaEventRecord(m.ready, stream_), rank_, what, "cudaEventRecord");
  std::lock_guard<std::mutex> lock(g.mu_);
  g.mailbox_[rank_ * g.n_ + dst].push_back(m);
  g.cv_.notify_all();
}

void DeviceLocalComm::recv(void* data, size_t bytes, int src) {
  DeviceLocalGroup& g = *group_;
  const std::string what = str_cat("recv(", bytes, " bytes from rank ", src, ")");
  if (src < 0 || src >= g.n_ || src == rank_) fail(ErrorCode::kInternal, "rank ", rank_, ": ", what, ": bad source");
  DeviceLocalGroup::Message m{};
  {
    std::unique_lock<std::mutex> lock(g.mu_);
    auto& box = g.mailbox_[src * g.n_ + rank_];
    const bool got = g.cv_.wait_for(lock, g.timeout_, [&] { return !box.empty() || !g.aborted_.empty(); });
    if (!box.empty()) {
      m = box.front();
      box.erase(box.begin());
    } else if (!got) {
      fail(ErrorCode::kDistributed, "rank ", rank_, " of ", g.n_, ": ", what, " did not complete within ",
           seconds(g.timeout_), " s: rank ", src, " never sent it");
    } else {
      fail(ErrorCode::kDistributed, "rank ", rank_, " of ", g.n_, ": ", what, ": stopped because ", g.aborted_);
    }
  }
  if (m.bytes != bytes)
    fail(ErrorCode::kInternal, "rank ", rank_, ": ", what, ": rank ", src, " sent ", m.bytes, " bytes");
  cuda_ok(cudaStreamWaitEvent(stream_, m.ready, 0), rank_, what, "cudaStreamWaitEvent");
  cudaEventDestroy(m.ready);
  if (bytes)
    cuda_ok(cudaMemcpyAsync(data, m.buffer, bytes, cudaMemcpyDeviceToDevice, stream_), rank_, what, "cudaMemcpyAsync");
  cuda_ok(cudaFreeAsync(m.buffer, stream_), rank_, what, "cudaFreeAsync");
}

void DeviceLocalComm::barrier() { sync_phase(0, "barrier"); }

std::unique_ptr<Communicator> DeviceLocalComm::split(int color, int key) {
  DeviceLocalGroup& g = *group_;
  const std::string what = str_cat("split(color ", color, ", key ", key, ")");
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    g.colors_[rank_] = color;
    g.keys_[rank_] = key;
  }
  g.arrive(rank_, what);
  // Members of this color, ordered by (key, rank); the first creates the group.
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    for (int q = 0; q < g.n_; ++q)
      if (g.colors_[q] == color) members.push_back(q);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return g.keys_[a] < g.keys_[b]; });
    if (members.front() == rank_)
      g.children_[rank_] = DeviceLocalGroup::create(static_cast<int>(members.size()), g.device_);
  }
  g.arrive(rank_, what);
  std::shared_ptr<DeviceLocalGroup> child;
  {
    std::lock_guard<std::mutex> lock(g.mu_);
    child = g.children_[members.front()];
  }
  g.arrive(rank_, what);  // everyone has its child before the slots are reused
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  return child->make(new_rank);
}

void DeviceLocalComm::abort(const char* what) noexcept {
  DeviceLocalGroup& g = *group_;
  std::lock_guard<std::mutex> lock(g.mu_);
  if (g.aborted_.empty()) g.aborted_ = str_cat("rank ", rank_, " failed: ", what ? what : "unknown");
  g.cv_.notify_all();
}

}  // namespace shardlm
