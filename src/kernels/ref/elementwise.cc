// STUB
#include "src/kernels/ref/reference.h"
