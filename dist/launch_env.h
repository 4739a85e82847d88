#pragma once
// Where this process stands in a job, as its launcher describes it in the environment:
// kiln-run and torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI's
// mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE) and Slurm's srun
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace kiln::dist {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = {};  // the host of rank 0's store
  int master_port = 0;
  std::string source = {};  // which launcher's variables were read: "torchrun", "mpirun", "slurm"
};

// Reads the launch environment through `getenv` (std::getenv by default; tests pass their
// own). The first launcher whose rank and size are both set wins, in the order torchrun,
// mpirun, Slurm. MASTER_ADDR and MASTER_PORT are read under any launcher; under mpirun and
// srun they may be left out when every rank runs on this node (127.0.0.1 and 29500, as
// torchrun's default port). Returns nullopt when no launcher's rank and size are set;
// throws kiln::Error naming the variable for a value that is not a number or out of range
// and when MASTER_ADDR is needed but absent.
using GetEnv = std::function<const char*(const char*)>;
std::optional<LaunchEnv> read_launch_env(const GetEnv& getenv = {});

}  // namespace kiln::dist
