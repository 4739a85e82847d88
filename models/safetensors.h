#pragma once
// Checkpoints in the safetensors format (the one PyTorch and Hugging Face use): an 8-byte
// little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and byte
// range, then the raw little-endian tensor bytes.
#include <map>
#include <string>

#include "models/state_dict.h"

namespace kiln {

using SafetensorsMetadata = std::map<std::string, std::string>;

// Writes `tensors` (any strides, any device: they are written contiguous, from the CPU) and
// `metadata` to `path` atomically: through a temporary file in the same directory that is
// fsync'ed and renamed over `path`, so a failed save leaves no partial file behind.
void save_safetensors(const StateDict& tensors, const std::string& path,
                      const SafetensorsMetadata& metadata = {});

struct SafetensorsContents {
  StateDict tensors;  // contiguous CPU tensors
  SafetensorsMetadata metadata;
};

// Reads every tensor of a safetensors file into CPU memory after validating the whole file;
// a malformed file is a kiln::Error naming the file and, where it applies, the tensor.
StateDict load_safetensors(const std::string& path);
// As load_safetensors, with the header's "__metadata__" too.
SafetensorsContents load_safetensors_with_metadata(const std::string& path);

}  // namespace kiln
