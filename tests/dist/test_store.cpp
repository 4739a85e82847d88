// The TCP store and the reading of launchers' environments, in one process.
#include <chrono>
#include <map>
#include <thread>

#include "dist/launch_env.h"
#include "dist/tcp_store.h"
#include "testing.h"

using namespace kiln;
using namespace std::chrono_literals;

TEST_CASE("the TCP store sets, gets, adds and waits across clients", "[dist]") {
  dist::TcpStore server({.port = 0, .is_server = true, .timeout = 5s});
  dist::TcpStore client({.port = server.port(), .timeout = 5s});
  server.set("a", std::string("alpha"));
  CHECK(client.get_string("a") == "alpha");
  CHECK(client.add("n", 2) == 2);
  CHECK(server.add("n", 3) == 5);
  CHECK(client.get_string("n") == "5");
  CHECK(client.check({"a", "b"}) == std::vector<bool>{true, false});
  // get and wait block until another client sets the key.
  std::thread later([&server] {
    std::this_thread::sleep_for(50ms);
    server.set("b", std::vector<char>{'x', '\0', 'y'});
  });
  client.wait({"a", "b"});
  CHECK(client.get("b") == std::vector<char>{'x', '\0', 'y'});
  later.join();
  CHECK(client.local_address() == "127.0.0.1");
}

TEST_CASE("the TCP store bounds its waits and names what it waited for", "[dist]") {
  dist::TcpStore server({.port = 0, .is_server = true, .timeout = 5s});
  dist::TcpStore client({.port = server.port(), .timeout = 200ms});
  server.set("here", std::string("1"));
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(client.wait({"here", "missing"}),
                      Catch::Contains("keys [missing] not set within 0.2 s") && Catch::Contains("127.0.0.1"));
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  REQUIRE_THROWS_WITH(client.get("missing"), Catch::Contains("key 'missing' not set within 0.2 s"));
  // The connection recovers after a timeout.
  CHECK(client.get_string("here") == "1");
}

TEST_CASE("the TCP store's clients fail when the server is gone, or never came", "[dist]") {
  auto server = std::make_unique<dist::TcpStore>(dist::TcpStoreOptions{.port = 0, .is_server = true, .timeout = 5s});
  const int port = server->port();
  dist::TcpStore client({.port = port, .timeout = 5s});
  server.reset();
  REQUIRE_THROWS_WITH(client.get("x"), Catch::Contains("closed the connection"));
  REQUIRE_THROWS_WITH(dist::TcpStore({.port = port, .timeout = 300ms}),
                      Catch::Contains("cannot reach the store at 127.0.0.1:" + std::to_string(port)));
}

namespace {
dist::GetEnv env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST_CASE("the launch environment of torchrun, mpirun and srun", "[dist]") {
  CHECK_FALSE(dist::read_launch_env(env_of({})).has_value());
  auto torchrun = dist::read_launch_env(env_of(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}}));
  REQUIRE(torchrun.has_value());
  CHECK(torchrun->source == "torchrun");
  CHECK((torchrun->rank == 3 && torchrun->world_size == 4 && torchrun->local_rank == 1));
  CHECK((torchrun->master_addr == "node0" && torchrun->master_port == 1234));
  // mpirun on one node: every rank local, so rank 0's store is on this host.
  auto mpi = dist::read_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  REQUIRE(mpi.has_value());
  CHECK((mpi->source == "mpirun" && mpi->rank == 1 && mpi->world_size == 2 && mpi->local_rank == 1));
  CHECK((mpi->master_addr == "127.0.0.1" && mpi->master_port == 29500));
  auto slurm = dist::read_launch_env(env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                             {"SLURM_NNODES", "2"}, {"MASTER_ADDR", "10.0.0.1"}}));
  REQUIRE(slurm.has_value());
  CHECK((slurm->source == "slurm" && slurm->rank == 5 && slurm->world_size == 8 && slurm->local_rank == 1));
  CHECK((slurm->master_addr == "10.0.0.1" && slurm->master_port == 29500));
  // Several nodes and no MASTER_ADDR: nobody knows where rank 0 is.
  REQUIRE_THROWS_WITH(dist::read_launch_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_NNODES", "2"}})),
                      Catch::Contains("MASTER_ADDR (the host of rank 0) is not set"));
  REQUIRE_THROWS_WITH(dist::read_launch_env(env_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}})),
                      Catch::Contains("RANK=4 is not below WORLD_SIZE=4"));
  REQUIRE_THROWS_WITH(dist::read_launch_env(env_of({{"RANK", "x"}, {"WORLD_SIZE", "4"}})),
                      Catch::Contains("RANK=x is not an integer"));
  REQUIRE_THROWS_WITH(
      dist::read_launch_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
      Catch::Contains("not MASTER_PORT"));
}
