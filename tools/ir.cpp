// kiln-ir: dumps of kiln's compiler stages. Until the compiler lands it lists the op
// registry: `kiln-ir --ops`.
#include <cstring>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include <kiln.h>

using namespace kiln;

namespace {

int list_ops() {
  const auto ops = all_ops();
  fmt::print("{:<28} {:<8} {:<10} {:<9} {}\n", "op", "kind", "devices", "backward", "notes");
  for (const OpDef* op : ops) {
    std::string devices;
    if (op->kind == OpKind::view) devices = "any";
    for (int d = 0; d < kNumDeviceTypes; ++d) {
      if (!op->kernels[d]) continue;
      if (!devices.empty()) devices += ",";
      devices += d == static_cast<int>(DeviceType::cpu) ? "cpu" : "cuda";
    }
    std::string notes;
    if (op->random) notes += "random ";
    if (!op->mutated_inputs.empty()) {
      notes += "writes input";
      for (int i : op->mutated_inputs) notes += fmt::format(" {}", i);
    }
    fmt::print("{:<28} {:<8} {:<10} {:<9} {}\n", op->name,
               op->kind == OpKind::view ? "view" : "compute", devices.empty() ? "-" : devices,
               op->backward ? "yes" : "no", notes);
  }
  fmt::print("{} ops\n", ops.size());
  return 0;
}

void usage(std::ostream& os) {
  os << "usage: kiln-ir --ops\n"
        "  --ops   list every registered op: kind, devices with a kernel, backward formula\n"
        "(the IR stages of a compiled model arrive with the compiler)\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--ops") == 0) return list_ops();
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    usage(std::cout);
    return 0;
  }
  usage(std::cerr);
  return 2;
}
