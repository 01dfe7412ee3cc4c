// MpiComm: ranks are OpenMPI processes, on one host or several, launched with
// mpirun. Only built with SHARDLM_MPI (SHARDLM_HAVE_MPI defined).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace shardlm {

// True when this process was started by mpirun (OMPI_COMM_WORLD_SIZE is set).
bool launched_by_mpirun();

#ifdef SHARDLM_HAVE_MPI
// Initialises MPI for the lifetime of the object and finalises it after.
// MPI_THREAD_SERIALIZED: one thread communicates at a time, but not always
// the one that initialised (serve's engine thread runs the collectives).
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  // The world communicator.
  std::unique_ptr<Communicator> world();
};

std::unique_ptr<Communicator> make_mpi_world_comm();
#endif

}  // namespace shardlm
