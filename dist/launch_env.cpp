#include "dist/launch_env.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "core/error.h"

namespace kiln::dist {
namespace {

constexpr int kDefaultPort = 29500;

struct Names {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: the launcher does not say
  const char* nodes;       // nullptr: the launcher does not say
};

constexpr Names kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", nullptr, nullptr},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_NNODES"},
};

// The integer value of `name`, nullopt when unset or empty.
std::optional<int64_t> read_int(const GetEnv& getenv, const char* name, int64_t lo, int64_t hi) {
  const char* value = getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  KILN_CHECK(errno == 0 && end != value && *end == '\0' && parsed >= lo && parsed <= hi,
             "init_process_group: {}={} is not an integer between {} and {}", name, value, lo, hi);
  return parsed;
}

}  // namespace

std::optional<LaunchEnv> read_launch_env(const GetEnv& given) {
  const GetEnv getenv = given ? given : GetEnv([](const char* name) -> const char* { return std::getenv(name); });
  constexpr int64_t kMaxRanks = 1 << 20;
  for (const Names& names : kLaunchers) {
    const std::optional<int64_t> size = read_int(getenv, names.size, 1, kMaxRanks);
    const std::optional<int64_t> rank = read_int(getenv, names.rank, 0, kMaxRanks);
    if (!size || !rank) continue;
    KILN_CHECK(*rank < *size, "init_process_group: {}={} is not below {}={}", names.rank, *rank,
               names.size, *size);
    LaunchEnv env;
    env.source = names.source;
    env.rank = static_cast<int>(*rank);
    env.world_size = static_cast<int>(*size);
    env.local_rank = static_cast<int>(read_int(getenv, names.local_rank, 0, kMaxRanks).value_or(0));
    // Every rank on this node: the launcher's local size is the world size, or one node.
    bool single_node = false;
    if (names.local_size != nullptr)
      single_node = read_int(getenv, names.local_size, 1, kMaxRanks) == size;
    if (names.nodes != nullptr) single_node = read_int(getenv, names.nodes, 1, kMaxRanks) == 1;
    const char* addr = getenv("MASTER_ADDR");
    if (addr != nullptr && *addr != '\0') {
      env.master_addr = addr;
    } else {
      KILN_CHECK(single_node || *size == 1,
                 "init_process_group: {} ranks launched by {}, but MASTER_ADDR (the host of rank 0) "
                 "is not set; set MASTER_ADDR and MASTER_PORT in every rank's environment",
                 *size, names.source);
      env.master_addr = "127.0.0.1";
    }
    const std::optional<int64_t> port = read_int(getenv, "MASTER_PORT", 0, 65535);
    KILN_CHECK(port.has_value() || names.local_size != nullptr || names.nodes != nullptr,
               "init_process_group: {} set RANK={} and WORLD_SIZE={} but not MASTER_PORT", names.source,
               *rank, *size);
    env.master_port = static_cast<int>(port.value_or(kDefaultPort));
    return env;
  }
  return std::nullopt;
}

}  // namespace kiln::dist
