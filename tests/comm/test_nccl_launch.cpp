// The NCCL launcher's host side, no GPU needed: which launcher variables are read and in which
// order, how NCCL_COMM_ID is derived from MASTER_ADDR / MASTER_PORT, and the shared-file id
// exchange as seen by a rank other than 0. (tests/gpu/test_nccl.cu runs the launchers on GPUs.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <strata/comm/nccl/launch.hpp>

namespace {

namespace nccl = strata::nccl;

const std::vector<const char*> kVariables = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "NCCL_COMM_ID", "STRATA_NCCL_PORT",
    "STRATA_NCCL_ID_FILE"};

class NcclLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kVariables) ::unsetenv(name);
  }
  void TearDown() override {
    for (const char* name : kVariables) ::unsetenv(name);
  }
  static void set(const char* name, const char* value) { ::setenv(name, value, 1); }
};

TEST_F(NcclLaunch, TorchrunVariables) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  const nccl::LaunchEnvironment env = nccl::launch_environment();
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
}

TEST_F(NcclLaunch, OpenMpiVariables) {
  set("OMPI_COMM_WORLD_RANK", "5");
  set("OMPI_COMM_WORLD_SIZE", "6");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  const nccl::LaunchEnvironment env = nccl::launch_environment();
  EXPECT_EQ(env.launcher, "Open MPI");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 2);
}

TEST_F(NcclLaunch, SlurmVariables) {
  set("SLURM_PROCID", "7");
  set("SLURM_NTASKS", "16");
  set("SLURM_LOCALID", "3");
  const nccl::LaunchEnvironment env = nccl::launch_environment();
  EXPECT_EQ(env.launcher, "Slurm");
  EXPECT_EQ(env.rank, 7);
  EXPECT_EQ(env.world_size, 16);
  EXPECT_EQ(env.local_rank, 3);
}

// torchrun inside a Slurm allocation, and mpirun inside one: the inner launcher wins.
TEST_F(NcclLaunch, InnerLauncherWinsOverSlurm) {
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "1");
  set("SLURM_LOCALID", "0");
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  EXPECT_EQ(nccl::launch_environment().launcher, "Open MPI");
  set("RANK", "1");
  set("WORLD_SIZE", "2");
  set("LOCAL_RANK", "1");
  EXPECT_EQ(nccl::launch_environment().launcher, "torchrun");
}

TEST_F(NcclLaunch, RefusesMissingOrBadVariablesNamingThem) {
  try {
    (void)nccl::launch_environment();
    FAIL() << "no launcher variables must be a ConfigError";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK, WORLD_SIZE and LOCAL_RANK"), std::string::npos) << e.what();
  }
  set("RANK", "2");
  try {
    (void)nccl::launch_environment();
    FAIL() << "RANK without WORLD_SIZE must be a ConfigError";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE is missing"), std::string::npos) << e.what();
  }
  set("WORLD_SIZE", "two");
  try {
    (void)nccl::launch_environment();
    FAIL() << "a WORLD_SIZE that is not a number must be a ConfigError";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE='two'"), std::string::npos) << e.what();
  }
  set("WORLD_SIZE", "2");
  try {
    (void)nccl::launch_environment();
    FAIL() << "RANK 2 of 2 must be a ConfigError";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 is not below the world size 2"), std::string::npos) << e.what();
  }
}

TEST_F(NcclLaunch, BootstrapAddressIsMasterPortPlusOne) {
  set("RANK", "1");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "10.1.2.3");
  set("MASTER_PORT", "29500");
  const nccl::LaunchEnvironment env = nccl::launch_environment();
  EXPECT_EQ(nccl::detail::ensure_bootstrap_address(env), "10.1.2.3:29501");
  ASSERT_NE(std::getenv("NCCL_COMM_ID"), nullptr);
  EXPECT_EQ(std::string(std::getenv("NCCL_COMM_ID")), "10.1.2.3:29501");
}

TEST_F(NcclLaunch, BootstrapAddressHonoursNcclCommIdAndStrataPort) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "node7");
  set("MASTER_PORT", "29500");
  set("STRATA_NCCL_PORT", "31000");
  const nccl::LaunchEnvironment env = nccl::launch_environment();
  EXPECT_EQ(nccl::detail::ensure_bootstrap_address(env), "node7:31000");
  set("NCCL_COMM_ID", "192.168.0.1:4000");
  EXPECT_EQ(nccl::detail::ensure_bootstrap_address(env), "192.168.0.1:4000");
  ::unsetenv("NCCL_COMM_ID");
  ::unsetenv("STRATA_NCCL_PORT");
  set("MASTER_ADDR", "fe80::1");
  EXPECT_EQ(nccl::detail::ensure_bootstrap_address(env), "[fe80::1]:29501");
}

TEST_F(NcclLaunch, BootstrapAddressNeedsMasterAddrAndPort) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  const nccl::LaunchEnvironment env = nccl::launch_environment();
  try {
    (void)nccl::detail::ensure_bootstrap_address(env);
    FAIL() << "no MASTER_ADDR must be a ConfigError";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("STRATA_NCCL_ID_FILE"), std::string::npos) << e.what();
  }
  set("MASTER_ADDR", "127.0.0.1");
  try {
    (void)nccl::detail::ensure_bootstrap_address(env);
    FAIL() << "MASTER_ADDR without MASTER_PORT must be a ConfigError";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT"), std::string::npos) << e.what();
  }
}

// A rank other than 0 reads the id rank 0 wrote, and names the file when it never appears.
TEST_F(NcclLaunch, IdFileIsReadByOtherRanksAndItsAbsenceTimesOut) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("strata-nccl-id-test." + std::to_string(::getpid()));
  std::filesystem::remove(path);
  nccl::LaunchEnvironment env;
  env.rank = 1;
  env.world_size = 2;
  env.launcher = "torchrun";
  try {
    (void)nccl::detail::exchange_id_through_file(path.string(), env, std::chrono::duration<double>(0.2));
    FAIL() << "a missing id file must time out";
  } catch (const strata::CommError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  ncclUniqueId written{};
  for (std::size_t i = 0; i < sizeof(written.internal); ++i) written.internal[i] = static_cast<char>(i * 7 + 1);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&written), sizeof(written));
  }
  const ncclUniqueId read = nccl::detail::exchange_id_through_file(path.string(), env, std::chrono::duration<double>(5));
  EXPECT_EQ(std::memcmp(&read, &written, sizeof(read)), 0);
  std::filesystem::remove(path);
}

}  // namespace
