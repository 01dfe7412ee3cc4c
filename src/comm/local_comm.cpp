#include "comm/local_comm.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace shardlm {

// Collectives work in rounds: every rank posts a pointer to its buffer, a
// barrier makes all posts visible, each rank reads what it needs, a second
// barrier keeps buffers alive until everyone has read.
class LocalWorld {
 public:
  explicit LocalWorld(int n)
      : n_(n),
        spin_(n <= static_cast<int>(std::thread::hardware_concurrency())),
        posted_(n, nullptr),
        scratch_(),
        mailboxes_(n * n) {}

  int size() const { return n_; }

  void barrier() {
    uint64_t gen = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      throw_if_aborted();
      gen = generation_.load(std::memory_order_relaxed);
      if (++arrived_ == n_) {
        arrived_ = 0;
        generation_.store(gen + 1, std::memory_order_release);
        cv_.notify_all();
        return;
      }
    }
    // TP ranks as threads meet here twice per collective, several times per
    // layer; when each has a core of its own, the others are usually a few
    // microseconds away, less than a futex sleep and wake-up costs. So spin
    // briefly first, unless the ranks outnumber the cores (then spinning
    // would take the core a late rank needs).
    if (spin_) {
      for (int i = 0; i < kSpinRounds; ++i) {
        if (generation_.load(std::memory_order_acquire) != gen) return;
        cpu_relax();
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != gen || aborted_; });
    throw_if_aborted();
  }

  void abort(int rank, const char* what) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) {
      aborted_ = true;
      abort_message_ = str_cat("rank ", rank, " failed: ", what);
    }
    cv_.notify_all();
  }

  void post(int rank, const void* p) { posted_[rank] = p; }
  const void* posted(int rank) const { return posted_[rank]; }
  std::vector<float>& scratch() { return scratch_; }

  void send(int src, int dst, const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    throw_if_aborted();
    auto& box = mailboxes_[src * n_ + dst];
    const auto* p = static_cast<const uint8_t*>(data);
    box.emplace_back(p, p + bytes);
    cv_.notify_all();
  }

  void recv(int src, int dst, void* data, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& box = mailboxes_[src * n_ + dst];
    cv_.wait(lock, [&] { return !box.empty() || aborted_; });
    throw_if_aborted();
    std::vector<uint8_t> msg = std::move(box.front());
    box.pop_front();
    if (msg.size() != bytes)
      fail(ErrorCode::kDistributed, "rank ", dst, " expected ", bytes, " bytes from rank ", src, ", got ", msg.size());
    std::memcpy(data, msg.data(), bytes);
  }

  // split bookkeeping: (color, key) per rank, then the worlds created.
  std::vector<std::pair<int, int>> split_keys;
  std::map<int, std::shared_ptr<LocalWorld>> split_worlds;
  std::mutex split_mutex;

 private:
  void throw_if_aborted() {
    if (aborted_) throw Error(ErrorCode::kDistributed, abort_message_);
  }

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }
  static constexpr int kSpinRounds = 4000;  // a few tens of microseconds of pause instructions

  const int n_;
  const bool spin_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::atomic<uint64_t> generation_{0};
  bool aborted_ = false;
  std::string abort_message_;
  std::vector<const void*> posted_;
  std::vector<float> scratch_;
  std::vector<std::deque<std::vector<uint8_t>>> mailboxes_;  // [src * n + dst]
};

LocalComm::LocalComm(std::shared_ptr<LocalWorld> world, int rank) : world_(std::move(world)), rank_(rank) {}
LocalComm::~LocalComm() = default;

int LocalComm::size() const { return world_->size(); }

std::vector<std::unique_ptr<LocalComm>> LocalComm::create_world(int n_ranks) {
  SHARDLM_CHECK(n_ranks >= 1);
  auto world = std::make_shared<LocalWorld>(n_ranks);
  std::vector<std::unique_ptr<LocalComm>> comms;
  for (int r = 0; r < n_ranks; ++r) comms.push_back(std::make_unique<LocalComm>(world, r));
  return comms;
}

void LocalComm::barrier() { world_->barrier(); }

void LocalComm::all_reduce_sum(void* data, size_t count, DType dtype) {
  const int n = world_->size();
  if (n == 1) return;
  world_->post(rank_, data);
  if (rank_ == 0) world_->scratch().assign(count, 0.0f);
  world_->barrier();
  // Each rank reduces its slice of the array over all ranks, in rank order
  // and in f32, so the result is identical on every rank and from run to run.
  const size_t chunk = (count + n - 1) / n;
  const size_t begin = std::min(count, chunk * rank_);
  const size_t end = std::min(count, begin + chunk);
  float* out = world_->scratch().data();
  if (dtype == DType::kF32) {
    for (size_t i = begin; i < end; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < n; ++r) sum += static_cast<const float*>(world_->posted(r))[i];
      out[i] = sum;
    }
  } else {
    for (size_t i = begin; i < end; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < n; ++r) sum += load_as_f32(world_->posted(r), dtype, i);
      out[i] = sum;
    }
  }
  world_->barrier();
  if (dtype == DType::kF32) {
    std::memcpy(data, out, count * sizeof(float));
  } else {
    for (size_t i = 0; i < count; ++i) store_from_f32(data, dtype, i, out[i]);
  }
  world_->barrier();
}

void LocalComm::all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
  const int n = world_->size();
  SHARDLM_CHECK(static_cast<int>(counts.size()) == n);
  const size_t esize = dtype_size(dtype);
  world_->post(rank_, in);
  world_->barrier();
  size_t offset = 0;
  for (int r = 0; r < n; ++r) {
    const void* src = world_->posted(r);
    char* dst = static_cast<char*>(out) + offset * esize;
    if (dst != src) std::memmove(dst, src, counts[r] * esize);
    offset += counts[r];
  }
  world_->barrier();
}

void LocalComm::broadcast(void* data, size_t bytes, int root) {
  if (world_->size() == 1) return;
  if (rank_ == root) world_->post(root, data);
  world_->barrier();
  if (rank_ != root) std::memcpy(data, world_->posted(root), bytes);
  world_->barrier();
}

void LocalComm::send(const void* data, size_t bytes, int dst) {
  SHARDLM_CHECK(dst >= 0 && dst < size() && dst != rank_);
  world_->send(rank_, dst, data, bytes);
}

void LocalComm::recv(void* data, size_t bytes, int src) {
  SHARDLM_CHECK(src >= 0 && src < size() && src != rank_);
  world_->recv(src, rank_, data, bytes);
}

std::unique_ptr<Communicator> LocalComm::split(int color, int key) {
  const int n = world_->size();
  {
    std::lock_guard<std::mutex> lock(world_->split_mutex);
    if (world_->split_keys.size() != static_cast<size_t>(n)) world_->split_keys.assign(n, {0, 0});
    world_->split_keys[rank_] = {color, key};
  }
  world_->barrier();
  // Members of my color, ordered by (key, old rank).
  std::vector<std::pair<int, int>> members;
  for (int r = 0; r < n; ++r)
    if (world_->split_keys[r].first == color) members.push_back({world_->split_keys[r].second, r});
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == rank_) new_rank = static_cast<int>(i);
  if (new_rank == 0) {
    std::lock_guard<std::mutex> lock(world_->split_mutex);
    world_->split_worlds[color] = std::make_shared<LocalWorld>(static_cast<int>(members.size()));
  }
  world_->barrier();
  std::shared_ptr<LocalWorld> sub;
  {
    std::lock_guard<std::mutex> lock(world_->split_mutex);
    sub = world_->split_worlds.at(color);
  }
  world_->barrier();
  if (new_rank == 0) {
    std::lock_guard<std::mutex> lock(world_->split_mutex);
    world_->split_worlds.erase(color);
  }
  return std::make_unique<LocalComm>(sub, new_rank);
}

void LocalComm::abort(const char* what) noexcept { world_->abort(rank_, what); }

void run_local_ranks(int n_ranks, const std::function<void(Communicator&)>& body) {
  auto comms = LocalComm::create_world(n_ranks);
  std::vector<std::string> errors(n_ranks);
  // Failed on its own, not because a peer did. One byte per rank: ranks
  // write their own entry at once, and vector<bool> packs them into shared
  // words (a data race that can lose a rank's failure; TSan found it).
  std::vector<char> primary(n_ranks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n_ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (const Error& e) {
        errors[r] = e.what();
        primary[r] = e.code() != ErrorCode::kDistributed;
        comms[r]->abort(e.what());
      } catch (const std::exception& e) {
        errors[r] = e.what();
        primary[r] = true;
        comms[r]->abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n_ranks; ++r)
    if (primary[r]) fail(ErrorCode::kDistributed, "rank ", r, " failed: ", errors[r]);
  for (int r = 0; r < n_ranks; ++r)
    if (!errors[r].empty()) fail(ErrorCode::kDistributed, errors[r]);
}

}  // namespace shardlm
