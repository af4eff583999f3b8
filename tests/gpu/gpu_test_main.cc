// gtest main of the single-process GPU suites: MPI initialised as a singleton (the trainer and the
// communicators need it), and exit code 77 (meson's SKIP) when every test skipped itself for want
// of a device, since gtest exits 0 then and a run without a GPU would otherwise pass silently.
#include <gtest/gtest.h>

#include "dpt/bootstrap.h"

int main(int argc, char** argv) {
  dpt::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const auto* unit = ::testing::UnitTest::GetInstance();
  if (rc == 0 && unit->test_to_run_count() > 0 &&
      unit->skipped_test_count() == unit->test_to_run_count())
    return 77;
  return rc;
}
