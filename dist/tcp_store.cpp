#include "dist/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "core/error.h"

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;

enum class Command : uint8_t { set = 1, get = 2, add = 3, wait = 4, check = 5 };

// A number's bytes as they lie in memory (every rank of a job runs on one byte order).
template <class T>
void put(std::vector<char>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
void put_bytes(std::vector<char>& out, const char* data, size_t size) {
  put<uint32_t>(out, static_cast<uint32_t>(size));
  out.insert(out.end(), data, data + size);
}
void put_string(std::vector<char>& out, const std::string& s) { put_bytes(out, s.data(), s.size()); }
std::vector<char> start(Command command) {
  std::vector<char> body;
  body.reserve(256);
  body.push_back(static_cast<char>(command));
  return body;
}

// Reads fields from a received message; a malformed one is an error (the server drops the
// client that sent it).
struct Reader {
  const std::vector<char>& data;
  size_t at = 0;
  void need(size_t n) const {
    KILN_CHECK(at + n <= data.size(), "TcpStore: a malformed message ({} bytes, field at {})", data.size(), at);
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  uint32_t u32() { return get<uint32_t>(); }
  int64_t i64() { return get<int64_t>(); }
  std::string string() {
    const uint32_t n = u32();
    need(n);
    std::string s(data.data() + at, n);
    at += n;
    return s;
  }
};

// Sends all of `data`; false when the peer is gone.
bool send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool send_message(int fd, const std::vector<char>& body) {
  std::vector<char> framed;
  framed.reserve(body.size() + 4);
  put<uint32_t>(framed, static_cast<uint32_t>(body.size()));
  framed.insert(framed.end(), body.begin(), body.end());
  return send_all(fd, framed.data(), framed.size());
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string seconds(std::chrono::milliseconds ms) { return fmt::format("{:g} s", ms.count() / 1000.0); }

}  // namespace

// The server: one thread polling the listening socket, its clients and a wake-up pipe.
// Requests that wait (get, wait) are parked until a set or add makes their keys exist;
// the clients bound their own waits, and a client that gives up just closes its socket.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(int port) {
    listen_fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
    bool v6 = listen_fd_ >= 0;
    if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    KILN_CHECK(listen_fd_ >= 0, "TcpStore: socket() failed: {}", std::strerror(errno));
    int one = 1, zero = 0;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (v6) {
      ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 too
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_addr = in6addr_any;
      addr.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    } else {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    }
    if (rc != 0 || ::listen(listen_fd_, 128) != 0) {
      const std::string why = std::strerror(errno);
      ::close(listen_fd_);
      fail("TcpStore: cannot serve on port {}: {} (is another job using MASTER_PORT={}?)", port, why, port);
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    KILN_CHECK(::pipe(wake_) == 0, "TcpStore: pipe() failed: {}", std::strerror(errno));
    thread_ = std::thread([this] { serve(); });
  }

  ~TcpStoreServer() {
    const char byte = 0;
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &byte, 1);
    thread_.join();
    for (const Client& c : clients_) ::close(c.fd);
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  int port() const { return port_; }

 private:
  struct Client {
    int fd;
    std::vector<char> in;  // bytes received, not yet a whole message
  };
  struct Parked {
    int fd;
    Command command;
    std::vector<std::string> keys;
  };

  void serve() {
    for (;;) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (const Client& c : clients_) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept(listen_fd_, nullptr, nullptr);
        if (fd >= 0) {
          set_nodelay(fd);
          clients_.push_back({fd, {}});
        }
      }
      std::vector<int> gone;
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (!receive(fds[i].fd)) gone.push_back(fds[i].fd);
      }
      for (int fd : gone) drop(fd);
    }
  }

  Client* find(int fd) {
    for (Client& c : clients_)
      if (c.fd == fd) return &c;
    return nullptr;
  }

  void drop(int fd) {
    std::erase_if(parked_, [fd](const Parked& p) { return p.fd == fd; });
    std::erase_if(clients_, [fd](const Client& c) {
      if (c.fd == fd) ::close(fd);
      return c.fd == fd;
    });
  }

  // Reads what arrived and handles each whole message; false when the client is gone or
  // sent something malformed.
  bool receive(int fd) {
    Client* client = find(fd);
    if (client == nullptr) return false;
    char buffer[65536];
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) return false;
    client->in.insert(client->in.end(), buffer, buffer + n);
    for (;;) {
      if (client->in.size() < 4) return true;
      uint32_t size;
      std::memcpy(&size, client->in.data(), 4);
      if (client->in.size() < 4 + size) return true;
      std::vector<char> message(client->in.begin() + 4, client->in.begin() + 4 + size);
      client->in.erase(client->in.begin(), client->in.begin() + 4 + size);
      try {
        if (!handle(fd, message)) return false;
      } catch (const Error&) {
        return false;
      }
      client = find(fd);
      if (client == nullptr) return false;
    }
  }

  bool handle(int fd, const std::vector<char>& message) {
    Reader in{message};
    in.need(1);
    const auto command = static_cast<Command>(message[0]);
    in.at = 1;
    switch (command) {
      case Command::set: {
        const std::string key = in.string();
        const uint32_t n = in.u32();
        in.need(n);
        data_[key].assign(message.begin() + static_cast<ptrdiff_t>(in.at),
                          message.begin() + static_cast<ptrdiff_t>(in.at + n));
        if (!send_message(fd, {})) return false;
        wake_parked();
        return true;
      }
      case Command::add: {
        const std::string key = in.string();
        const int64_t delta = in.i64();
        auto it = data_.find(key);
        const int64_t value = (it == data_.end() ? 0 : std::stoll(std::string(it->second.begin(), it->second.end()))) + delta;
        const std::string text = std::to_string(value);
        data_[key].assign(text.begin(), text.end());
        std::vector<char> reply;
        put<int64_t>(reply, value);
        if (!send_message(fd, reply)) return false;
        wake_parked();
        return true;
      }
      case Command::get:
      case Command::wait: {
        Parked parked{fd, command, {}};
        const uint32_t count = command == Command::get ? 1 : in.u32();
        for (uint32_t i = 0; i < count; ++i) parked.keys.push_back(in.string());
        if (ready(parked)) return answer(parked);
        parked_.push_back(std::move(parked));
        return true;
      }
      case Command::check: {
        const uint32_t count = in.u32();
        std::vector<char> reply;
        for (uint32_t i = 0; i < count; ++i) reply.push_back(data_.contains(in.string()) ? 1 : 0);
        return send_message(fd, reply);
      }
    }
    return false;
  }

  bool ready(const Parked& p) const {
    return std::all_of(p.keys.begin(), p.keys.end(), [this](const std::string& k) { return data_.contains(k); });
  }

  bool answer(const Parked& p) {
    if (p.command == Command::get) return send_message(p.fd, data_.at(p.keys[0]));
    return send_message(p.fd, {});
  }

  void wake_parked() {
    std::vector<int> gone;
    std::erase_if(parked_, [&](const Parked& p) {
      if (!ready(p)) return false;
      if (!answer(p)) gone.push_back(p.fd);
      return true;
    });
    for (int fd : gone) drop(fd);
  }

  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::vector<Client> clients_;
  std::vector<Parked> parked_;
  std::map<std::string, std::vector<char>> data_;
};

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  KILN_CHECK(options_.port >= 0 && options_.port <= 65535, "TcpStore: port {} is not between 0 and 65535",
             options_.port);
  KILN_CHECK(options_.timeout.count() > 0, "TcpStore: the timeout must be positive, got {} ms",
             options_.timeout.count());
  if (options_.is_server) {
    server_ = std::make_unique<TcpStoreServer>(options_.port);
    port_ = server_->port();
  } else {
    KILN_CHECK(options_.port > 0, "TcpStore: a client needs the server's port, got 0");
    port_ = options_.port;
  }
  connect();
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::string TcpStore::where() const { return fmt::format("{}:{}", options_.host, port_); }

void TcpStore::connect() {
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(port_);
  std::string last_error = "no address";
  for (auto pause = std::chrono::milliseconds(5);; pause = std::min(pause * 2, std::chrono::milliseconds(200))) {
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0) {
      last_error = ::gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          set_nodelay(fd);
          fd_ = fd;
          break;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(found);
    }
    if (fd_ >= 0) return;
    KILN_CHECK(Clock::now() + pause < deadline,
               "TcpStore: cannot reach the store at {} (rank 0's MASTER_ADDR:MASTER_PORT) within {}: {}",
               where(), seconds(options_.timeout), last_error);
    std::this_thread::sleep_for(pause);
  }
}

std::vector<char> TcpStore::request(const std::string& what, const std::vector<char>& body,
                                    std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  if (fd_ < 0) connect();
  auto broken = [&](const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    fail("TcpStore::{}: {} (store at {}; did rank 0 exit?)", what, why, where());
  };
  if (!send_message(fd_, body)) broken("the store closed the connection");
  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<char> in;
  uint32_t size = 0;
  bool have_size = false;
  for (;;) {
    if (!have_size && in.size() >= 4) {
      std::memcpy(&size, in.data(), 4);
      have_size = true;
    }
    if (have_size && in.size() >= 4 + size) return std::vector<char>(in.begin() + 4, in.end());
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      ::close(fd_);  // the reply may still come: this connection is out of step now
      fd_ = -1;
      fail("TcpStore::{}: no answer within {} (store at {})", what, seconds(timeout), where());
    }
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    char buffer[65536];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) broken("the store closed the connection");
    in.insert(in.end(), buffer, buffer + n);
  }
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  std::vector<char> body = start(Command::set);
  put_string(body, key);
  put_bytes(body, value.data(), value.size());
  request(fmt::format("set({})", key), body, options_.timeout);
}

void TcpStore::set(const std::string& key, const std::string& value) {
  set(key, std::vector<char>(value.begin(), value.end()));
}

std::vector<char> TcpStore::get(const std::string& key) {
  std::vector<char> body = start(Command::get);
  put_string(body, key);
  try {
    return request(fmt::format("get({})", key), body, options_.timeout);
  } catch (const Error& e) {
    fail("TcpStore::get: key '{}' not set within {} (store at {}): {}", key, seconds(options_.timeout), where(),
         e.what());
  }
}

std::string TcpStore::get_string(const std::string& key) {
  const std::vector<char> value = get(key);
  return std::string(value.begin(), value.end());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::vector<char> body = start(Command::add);
  put_string(body, key);
  put<int64_t>(body, delta);
  const std::vector<char> reply = request(fmt::format("add({})", key), body, options_.timeout);
  return Reader{reply}.i64();
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, options_.timeout); }

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<char> body = start(Command::wait);
  put<uint32_t>(body, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) put_string(body, k);
  try {
    request("wait", body, timeout);
  } catch (const Error& e) {
    std::vector<std::string> missing;
    try {
      const std::vector<bool> set = check(keys);
      for (size_t i = 0; i < keys.size(); ++i)
        if (!set[i]) missing.push_back(keys[i]);
    } catch (const Error&) {
      missing = keys;  // the store is gone: say which keys were asked for
    }
    fail("TcpStore::wait: keys [{}] not set within {} (store at {}): {}", fmt::join(missing, ", "),
         seconds(timeout), where(), e.what());
  }
}

std::vector<bool> TcpStore::check(const std::vector<std::string>& keys) {
  std::vector<char> body = start(Command::check);
  put<uint32_t>(body, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) put_string(body, k);
  const std::vector<char> reply = request("check", body, options_.timeout);
  KILN_CHECK(reply.size() == keys.size(), "TcpStore::check: {} answers for {} keys", reply.size(), keys.size());
  std::vector<bool> out;
  for (char c : reply) out.push_back(c != 0);
  return out;
}

std::string TcpStore::local_address() const {
  KILN_CHECK(fd_ >= 0, "TcpStore::local_address: not connected to the store at {}", where());
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  KILN_CHECK(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
             "TcpStore::local_address: getsockname failed: {}", std::strerror(errno));
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      in_addr v4;
      std::memcpy(&v4, a6->sin6_addr.s6_addr + 12, 4);
      ::inet_ntop(AF_INET, &v4, text, sizeof(text));
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof(text));
    }
  } else {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace kiln::dist
