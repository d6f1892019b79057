// Which launcher started a process, and the rendezvous address each one agrees on.
#include "bench/common/launcher.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "bench/common/bench_error.h"

namespace loom::bench {
namespace {

EnvFn envOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(BenchLauncher, StandaloneWithoutLauncherVariables) {
  Placement p = detectPlacement(envOf({{"HOME", "/root"}}));
  EXPECT_EQ(p.kind, LaunchKind::kStandalone);
  EXPECT_EQ(p.proc, 0);
  EXPECT_EQ(p.nProcs, 1);
  EXPECT_TRUE(p.commId.empty());
}

TEST(BenchLauncher, Torchrun) {
  Placement p = detectPlacement(envOf({{"RANK", "3"},
                                       {"WORLD_SIZE", "4"},
                                       {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", "10.0.0.5"},
                                       {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(p.kind, LaunchKind::kTorchrun);
  EXPECT_EQ(p.proc, 3);
  EXPECT_EQ(p.nProcs, 4);
  EXPECT_EQ(p.localRank, 1);
  EXPECT_EQ(p.localSize, 2);
  EXPECT_EQ(p.commId, "10.0.0.5:29500");
  // Under the torchrun agent, whose TCPStore holds MASTER_PORT, Loom takes the next port.
  Placement agent = detectPlacement(envOf({{"RANK", "0"},
                                           {"WORLD_SIZE", "2"},
                                           {"MASTER_ADDR", "h"},
                                           {"MASTER_PORT", "29500"},
                                           {"TORCHELASTIC_RUN_ID", "x"}}));
  EXPECT_EQ(agent.commId, "h:29501");
  EXPECT_EQ(agent.launcher, "torchrun");
  EXPECT_THROW(detectPlacement(envOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}})), BenchError);
  EXPECT_THROW(
      detectPlacement(
          envOf({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})),
      BenchError);
}

TEST(BenchLauncher, OpenMpiUsesFileExchangeKeyedByJob) {
  Placement p = detectPlacement(envOf({{"OMPI_COMM_WORLD_RANK", "1"},
                                       {"OMPI_COMM_WORLD_SIZE", "2"},
                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                       {"PMIX_NAMESPACE", "prterun-vm-1234@1"}}));
  EXPECT_EQ(p.kind, LaunchKind::kMpi);
  EXPECT_EQ(p.proc, 1);
  EXPECT_EQ(p.nProcs, 2);
  EXPECT_TRUE(p.fileExchange);
  EXPECT_EQ(p.exchangeKey, "prterun-vm-1234@1");
  // NCCL_COMM_ID wins over any derivation.
  Placement fixed = detectPlacement(envOf({{"OMPI_COMM_WORLD_RANK", "0"},
                                           {"OMPI_COMM_WORLD_SIZE", "2"},
                                           {"NCCL_COMM_ID", "10.1.1.1:5000"}}));
  EXPECT_FALSE(fixed.fileExchange);
  EXPECT_EQ(fixed.commId, "10.1.1.1:5000");
}

TEST(BenchLauncher, MpichPmi) {
  Placement p = detectPlacement(envOf({{"PMI_RANK", "2"},
                                       {"PMI_SIZE", "3"},
                                       {"MPI_LOCALRANKID", "0"},
                                       {"MPI_LOCALNRANKS", "1"},
                                       {"PMI_KVSNAME", "kvs_77"}}));
  EXPECT_EQ(p.kind, LaunchKind::kMpi);
  EXPECT_EQ(p.proc, 2);
  EXPECT_EQ(p.localSize, 1);
  EXPECT_EQ(p.exchangeKey, "kvs_77");
}

TEST(BenchLauncher, Srun) {
  std::map<std::string, std::string> env = {{"SLURM_PROCID", "5"},
                                            {"SLURM_STEP_NUM_TASKS", "8"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_STEP_NUM_NODES", "2"},
                                            {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                                            {"SLURM_JOB_ID", "1234"},
                                            {"SLURM_STEP_ID", "3"}};
  Placement p = detectPlacement(envOf(env));
  EXPECT_EQ(p.kind, LaunchKind::kSlurm);
  EXPECT_EQ(p.proc, 5);
  EXPECT_EQ(p.nProcs, 8);
  EXPECT_EQ(p.localRank, 1);
  EXPECT_EQ(p.commId, "gpu07:" + std::to_string(slurmPort(1234, 3)));
  env["SLURM_STEP_NUM_NODES"] = "1";
  env["LOOM_BENCH_PORT"] = "23456";
  EXPECT_EQ(detectPlacement(envOf(env)).commId, "127.0.0.1:23456");
  // sbatch alone (no srun step) with one task is not a multi-rank launch.
  Placement batch = detectPlacement(envOf({{"SLURM_JOB_ID", "9"},
                                           {"SLURM_PROCID", "0"},
                                           {"SLURM_NTASKS", "4"},
                                           {"SLURM_LOCALID", "0"}}));
  EXPECT_EQ(batch.kind, LaunchKind::kStandalone);
}

TEST(BenchLauncher, PrecedenceForkChildThenTorchrunThenMpiThenSlurm) {
  // srun torchrun ...: torchrun's RANK is the global rank, not SLURM_PROCID.
  Placement p = detectPlacement(envOf({{"RANK", "1"},
                                       {"WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", "a"},
                                       {"MASTER_PORT", "7"},
                                       {"SLURM_PROCID", "0"},
                                       {"SLURM_NTASKS", "1"}}));
  EXPECT_EQ(p.kind, LaunchKind::kTorchrun);
  Placement child = detectPlacement(envOf({{"LOOM_BENCH_RANK", "1"},
                                           {"LOOM_BENCH_NPROCS", "3"},
                                           {"NCCL_COMM_ID", "127.0.0.1:4000"},
                                           {"OMPI_COMM_WORLD_SIZE", "1"}}));
  EXPECT_EQ(child.kind, LaunchKind::kForkChild);
  EXPECT_EQ(child.proc, 1);
  EXPECT_EQ(child.nProcs, 3);
  EXPECT_EQ(child.commId, "127.0.0.1:4000");
}

TEST(BenchLauncher, SlurmNodelists) {
  EXPECT_EQ(firstSlurmHost("node01"), "node01");
  EXPECT_EQ(firstSlurmHost("node[01-04,07],login"), "node01");
  EXPECT_EQ(firstSlurmHost("a,b,c"), "a");
  EXPECT_EQ(firstSlurmHost("rack[3,5]-gpu"), "rack3-gpu");
  EXPECT_EQ(firstSlurmHost("gpu[007]"), "gpu007");
  for (long job : {0L, 1L, 99999L, 123456789L})
    for (long step : {0L, 1L, 4294967294L}) {
      int port = slurmPort(job, step);
      EXPECT_GE(port, 20000);
      EXPECT_LT(port, 50000);
    }
  EXPECT_NE(slurmPort(1000, 0), slurmPort(1000, 1));
}

TEST(BenchLauncher, HostPortFormatting) {
  EXPECT_EQ(joinHostPort("10.0.0.1", 80), "10.0.0.1:80");
  EXPECT_EQ(joinHostPort("fe80::1", 80), "[fe80::1]:80");
  EXPECT_EQ(resolveHost("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(resolveHost("localhost").substr(0, 4), "127.");
  int port = pickFreePort("127.0.0.1");
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
}

}  // namespace
}  // namespace loom::bench
