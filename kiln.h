#pragma once
// kiln: include this one header and link kiln::kiln.
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/registry.h"
#include "core/scalar.h"
#include "core/tensor.h"
