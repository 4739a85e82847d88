#pragma once
// What the token models (BERT, GPT-2) share about their inputs: the checks that turn a bad
// batch into an error naming the model and the shapes, and the key padding mask in
// scaled_dot_product_attention's convention.
#include <cstdint>

#include "core/tensor.h"
#include "models/layers.h"

namespace kiln::models {

// input_ids must be i64 [N, L] with 1 <= L <= max_length; an error naming `model` otherwise.
void check_input_ids(const char* model, const Tensor& input_ids, int64_t max_length);

// A per-token tensor `what` beside input_ids: the ids' shape and one of the integer or bool
// dtypes; undefined passes.
void check_per_token(const char* model, const char* what, const Tensor& t, const Tensor& input_ids,
                     bool allow_bool);

// attention_mask [N, L] (1 or true: a token; 0 or false: padding) as the bool mask
// [N, 1, 1, L] of the keys every query may attend to; undefined when the mask is.
Tensor key_padding_mask(const Tensor& attention_mask);

// embedding(ids) whose error for an id outside the table names `model`, what the ids are
// and the table's size.
Tensor embed_ids(const char* model, const char* what, const nn::Embedding& table,
                 const Tensor& ids);

}  // namespace kiln::models
