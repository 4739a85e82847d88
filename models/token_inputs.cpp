// The token models' input checks (models/token_inputs.h).
#include "models/token_inputs.h"

#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/indexing.h"

namespace kiln::models {

void check_input_ids(const char* model, const Tensor& input_ids, int64_t max_length) {
  KILN_CHECK(input_ids.defined(), "{}: input_ids are undefined", model);
  KILN_CHECK(input_ids.dtype() == DType::i64 && input_ids.dim() == 2,
             "{}: input_ids must be i64 [N, L], got {}", model, input_ids.meta_str());
  KILN_CHECK(input_ids.size(1) >= 1 && input_ids.size(1) <= max_length,
             "{}: input_ids {} hold sequences of {} tokens; the model takes 1 to {} (its "
             "position embeddings)",
             model, input_ids.meta_str(), input_ids.size(1), max_length);
}

void check_per_token(const char* model, const char* what, const Tensor& t, const Tensor& input_ids,
                     bool allow_bool) {
  if (!t.defined()) return;
  const bool dtype_ok = t.dtype() == DType::i64 || t.dtype() == DType::i32 ||
                        (allow_bool && t.dtype() == DType::boolean);
  KILN_CHECK(dtype_ok && t.shape() == input_ids.shape(),
             "{}: {} must be {} shaped like input_ids {}, got {}", model, what,
             allow_bool ? "i64, i32 or bool" : "i64 or i32", input_ids.meta_str(), t.meta_str());
}

Tensor key_padding_mask(const Tensor& attention_mask) {
  if (!attention_mask.defined()) return {};
  const Tensor keep =
      attention_mask.dtype() == DType::boolean ? attention_mask : ne(attention_mask, 0);
  return keep.unsqueeze(1).unsqueeze(1);
}

Tensor embed_ids(const char* model, const char* what, const nn::Embedding& table,
                 const Tensor& ids) {
  try {
    return embedding(table.weight(), ids, table.padding_idx());
  } catch (const Error& e) {
    fail("{}: {} {} hold an id outside [0, {}): {}", model, what, ids.meta_str(),
         table.weight().size(0), e.what());
  }
}

}  // namespace kiln::models
