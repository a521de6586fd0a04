// Range moved to runtime/range.h (kernels take it too); this header stays for code that names it.
#pragma once

#include "zerort/runtime/range.h"
