#pragma once
// models/ may include core/: no violation here.
#include "core/tensor.h"
