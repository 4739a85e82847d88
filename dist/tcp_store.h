#pragma once
// A key-value store over TCP, served by rank 0 (the role of c10d's TCPStore): the ranks
// meet through it, Gloo's rendezvous swaps addresses in it, and it hands out counters.
// Every call that waits is bounded by the store's timeout and then throws kiln::Error
// naming the keys it waited for and the store's address; a store that goes away (rank 0
// died) is an error too, never a hang.
//
// Protocol (one request, one reply, over one connection per client): a request is
// [u32 length][u8 command][fields], a reply [u32 length][payload]; a string field is
// [u32 length][bytes], an integer 8 bytes. The server answers get and wait once their keys
// exist, so nobody polls.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::dist {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // where the server is (clients connect there)
  int port = 0;                    // the server's port; 0 on the server: any free port
  bool is_server = false;          // this process serves the store (rank 0)
  std::chrono::milliseconds timeout{30000};  // bound of every wait, connecting included
};

class TcpStoreServer;

class TcpStore {
 public:
  // Serves (is_server) and connects, retrying until the server listens or the timeout.
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  void set(const std::string& key, const std::string& value);
  // The value of `key`, waiting up to the timeout for it to be set.
  std::vector<char> get(const std::string& key);
  std::string get_string(const std::string& key);
  // Adds delta to the integer under `key` (0 when absent) and returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  // Returns once every key is set; throws after `timeout` naming the keys still missing.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Which of `keys` are set now (no waiting).
  std::vector<bool> check(const std::vector<std::string>& keys);

  int port() const { return port_; }
  const std::string& host() const { return options_.host; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  // This end's IP address on the connection to the server: an address of this host that
  // the server's host (and so, usually, the other ranks) can reach.
  std::string local_address() const;

 private:
  std::vector<char> request(const std::string& what, const std::vector<char>& body,
                            std::chrono::milliseconds timeout);
  void connect();
  std::string where() const;

  TcpStoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
  int fd_ = -1;
  std::mutex mutex_;  // one request at a time on the connection
};

}  // namespace kiln::dist
