// libFuzzer target: load_safetensors (models/safetensors.cpp) on the input written to a
// file. Any input either loads or throws kiln::Error; what loads is saved and loaded again
// to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "fuzz_file.h"
#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln::fuzz::write_input("input.safetensors", data, size).string();
  kiln::SafetensorsContents contents;
  try {
    contents = kiln::load_safetensors_with_metadata(path);
  } catch (const kiln::Error&) {
    return 0;
  }
  const std::string copy = (kiln::fuzz::scratch_folder() / "copy.safetensors").string();
  kiln::save_safetensors(contents.tensors, copy, contents.metadata);
  const kiln::SafetensorsContents again = kiln::load_safetensors_with_metadata(copy);
  if (again.metadata != contents.metadata || again.tensors.size() != contents.tensors.size())
    std::abort();
  for (const auto& [name, tensor] : contents.tensors) {
    const kiln::Tensor& other = again.tensors.at(name);
    if (other.shape() != tensor.shape() || other.dtype() != tensor.dtype()) std::abort();
    const size_t nbytes = static_cast<size_t>(tensor.numel()) * tensor.itemsize();
    if (nbytes > 0 && std::memcmp(other.data_ptr(), tensor.data_ptr(), nbytes) != 0) std::abort();
  }
  return 0;
}
