#include "cli/serve_mpi.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>

#include "cli/auto_layout_flag.h"
#include "comm/mpi_comm.h"
#include "core/error.h"
#include "engine/mpi_group_executor.h"

namespace shardlm::cli {

namespace {

int mpirun_world_size() {
  const char* n = launched_by_mpirun() ? std::getenv("OMPI_COMM_WORLD_SIZE") : nullptr;
  return n ? std::max(1, std::atoi(n)) : 1;
}

}  // namespace

#ifdef SHARDLM_HAVE_MPI

namespace {

constexpr size_t kHostBytes = 256;

std::array<char, kHostBytes> this_host() {
  std::array<char, kHostBytes> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) std::snprintf(name.data(), name.size(), "localhost");
  return name;
}

}  // namespace

ServeMpi::ServeMpi(const std::string& model_dir, const Layout& requested, const std::string& host, int port,
                   const std::function<Layout()>& choose_auto)
    : model_dir_(model_dir), layout_(requested), host_(host), port_(port) {
  const bool tp_auto = requested.tp == kAutoDegree;
  if (mpirun_world_size() <= 1) {
    if (tp_auto) layout_ = choose_auto();
    return;
  }
  runtime_ = std::make_unique<MpiRuntime>(nullptr, nullptr);
  auto world = runtime_->world();
  if (tp_auto) layout_ = agree_on_layout(*world, choose_auto);
  const Layout& layout = layout_;
  if (world->size() != layout.world_size())
    fail(ErrorCode::kInvalidArgument, "mpirun started ", world->size(), " processes but ", layout.to_string(), " needs ",
         layout.world_size(), " (tp × pp × dp = ", layout.tp, " × ", layout.pp, " × ", layout.dp, "); run mpirun -np ",
         layout.world_size(), " or change --tp/--pp/--dp");
  WorldConfig wc{world->rank(), layout};
  dp_rank_ = wc.dp_rank();
  // Each replica's driver tells rank 0 its host, for the router line.
  const int per_replica = layout.ranks_per_replica();
  if (world->rank() == 0) {
    const bool any_host = host == "0.0.0.0" || host == "::" || host.empty();
    std::string line = "shardlm router";
    for (int d = 0; d < layout.dp; ++d) {
      std::array<char, kHostBytes> name = this_host();
      if (d > 0) world->recv(name.data(), name.size(), d * per_replica);
      line += " --backend http://" + (any_host ? std::string(name.data()) : host) + ":" + std::to_string(port + d);
    }
    std::cerr << "shardlm serve: " << layout.world_size() << " MPI processes, " << layout.to_string()
              << "; replica d serves on port " << port << " + d. Front the replicas with:\n  " << line
              << " --port <router port>" << std::endl;
  } else if (world->rank() % per_replica == 0) {
    std::array<char, kHostBytes> name = this_host();
    world->send(name.data(), name.size(), 0);
  }
  world_ = std::move(world);
}

#else

}  // namespace shardlm::cli

namespace shardlm {
// Never created in a build without MPI; complete so that ServeMpi's
// unique_ptr member can be destroyed.
class MpiRuntime {};
}  // namespace shardlm

namespace shardlm::cli {

ServeMpi::ServeMpi(const std::string& model_dir, const Layout& requested, const std::string& host, int port,
                   const std::function<Layout()>& choose_auto)
    : model_dir_(model_dir), layout_(requested), host_(host), port_(port) {
  if (requested.tp == kAutoDegree && mpirun_world_size() <= 1) layout_ = choose_auto();
  if (mpirun_world_size() > 1)
    fail(ErrorCode::kUnsupported, "started by mpirun with ", mpirun_world_size(),
         " processes, but this build has no MPI; configure with -DSHARDLM_MPI=ON");
}

#endif

ServeMpi::~ServeMpi() {
  // The driver failed before or while loading (port taken, tokenizer
  // missing): its workers wait in a collective for it, so stop the world.
  if (world_ && std::uncaught_exceptions() > 0) world_->abort("shardlm serve failed on a replica driver");
}

int ServeMpi::world_rank() const { return world_ ? world_->rank() : 0; }

bool ServeMpi::is_driver() const { return !world_ || world_->rank() % layout_.ranks_per_replica() == 0; }

int ServeMpi::port() const { return port_ + dp_rank_; }

int ServeMpi::run_worker() {
  // mpirun forwards SIGINT/SIGTERM to every rank: the workers ignore them and
  // stop when their driver, which drains its requests first, says so.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  MpiGroupOptions mo;
  mo.model_dir = model_dir_;
  mo.layout = layout_;
  mo.device = device_;
  MpiGroupExecutor executor(*world_, mo);  // KV geometry comes from the driver
  executor.run_worker();
  return 0;
}

void ServeMpi::attach(server::EngineBackendOptions* options) {
  if (!world_) return;
  options->layout.dp = 1;  // this process serves its own replica
  Communicator* world = world_.get();
  const Layout layout = layout_;
  const std::filesystem::path dir = model_dir_;
  const Device device = device_;
  options->make_executor = [world, layout, dir, device](const ModelSpec&, const LocalGroupOptions& lo,
                                               std::vector<LocalGroupExecutor::RankMemory>* allocated) {
    MpiGroupOptions mo;
    mo.model_dir = dir;
    mo.layout = layout;
    mo.layout.pp_layer_partition = lo.layout.pp_layer_partition;
    mo.n_blocks = lo.n_blocks;
    mo.n_local_blocks = lo.n_local_blocks;
    mo.block_size = lo.block_size;
    mo.kv_dtype = lo.kv_dtype;
    mo.batch_invariant = lo.batch_invariant;
    mo.device = device;
    auto executor = std::make_unique<MpiGroupExecutor>(*world, mo);
    allocated->clear();
    for (const RankBytes& b : executor->rank_bytes())
      allocated->push_back({b.tp_rank, b.pp_rank, b.weight_bytes, b.kv_bytes});
    std::cerr << describe_rank_bytes(executor->rank_bytes());
    return std::unique_ptr<ModelExecutor>(std::move(executor));
  };
}

}  // namespace shardlm::cli
