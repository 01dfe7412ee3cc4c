// The model tests run many short OpenMP regions on a shared 2-core machine:
// with libgomp's default active waiting, a thread spinning at a barrier
// while its partner is descheduled burns whole timeslices (10x slower).
// OMP_WAIT_POLICY is read when libgomp loads, so set it and re-exec once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

int main(int argc, char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // on failure, run as we are
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
