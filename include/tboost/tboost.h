// Umbrella header: everything an engine needs to create and run tboost operations.
#pragma once

#include "tboost/core/context.h"
#include "tboost/core/cpu_features.h"
#include "tboost/core/dtype.h"
#include "tboost/core/error.h"
#include "tboost/core/tensor.h"
#include "tboost/kernels/cpu.h"
#include "tboost/ops/operation.h"
