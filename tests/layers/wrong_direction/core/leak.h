#pragma once
// A core header reaching up into models/: what cmake/check_layers.cmake must refuse.
#include "models/module.h"
