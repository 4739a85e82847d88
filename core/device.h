#pragma once
// Where a tensor lives: the CPU, or CUDA device N.
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace kiln {

enum class DeviceType : uint8_t { cpu, cuda };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int n = 0) { return {DeviceType::cuda, n}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const {
    return type == DeviceType::cpu ? std::string("cpu") : fmt::format("cuda:{}", index);
  }
};

}  // namespace kiln

template <>
struct fmt::formatter<kiln::Device> : fmt::formatter<std::string> {
  auto format(const kiln::Device& d, format_context& ctx) const {
    return fmt::formatter<std::string>::format(d.str(), ctx);
  }
};
