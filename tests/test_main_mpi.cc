// gtest main for tests that need MPI: initialises MPI (a singleton without mpirun, or one rank of
// mpirun -np k), prints results on rank 0 only, and exits with the worst result over all ranks so
// every rank agrees whether the suite passed.
#include <gtest/gtest.h>
#include <mpi.h>

#include "dpt/bootstrap.h"

int main(int argc, char** argv) {
  dpt::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.world().rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (mpi.world().rank != 0 && rc != 0)
    std::fprintf(stderr, "rank %d: %d test(s) failed\n", mpi.world().rank,
                 ::testing::UnitTest::GetInstance()->failed_test_count());
  return worst;
}
