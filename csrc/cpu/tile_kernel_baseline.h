// Everything the tile kernels (supcon_tiles_kernels.h) include apart from ATen's vector types,
// for a per-ISA file to include before it raises the instruction set (isa_target.h says why).
// ATen's vector headers come with their own c10 and ATen dependencies, listed here too, so that
// they are defined at the baseline. A header missing from this list shows up in `objdump -d` of
// the built library as AVX (v-prefixed) instructions in a function outside the per-ISA namespaces.
#pragma once

#include <ATen/AccumulateType.h>
#include <ATen/NumericUtils.h>
#include <ATen/Parallel.h>
#include <ATen/native/Math.h>
#include <ATen/native/quantized/AffineQuantizerBase.h>
#include <c10/util/BFloat16-math.h>
#include <c10/util/Float4_e2m1fn_x2.h>
#include <c10/util/Float8_e8m0fnu.h>
#include <c10/util/Lazy.h>
#include <c10/util/Load.h>
#include <c10/util/TypeCast.h>
#include <c10/util/complex.h>
#include <c10/util/copysign.h>
#include <c10/util/irange.h>
#include <c10/util/quint2x4.h>
#include <c10/util/quint4x2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "blas.h"
#include "supcon_tiles.h"
#include "tile_schedule.h"
