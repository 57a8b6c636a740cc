// Package kernels holds the device sources of runtime/symm, hand-written
// here once: collgen_symm.cuh, the header users' kernels include, which
// runtime/symm embeds (symm.DeviceHeader) and `collgen generate` copies into
// the generated tree (templates/cuda).
package kernels

import _ "embed"

// HeaderPath is SymmHeader's path in the repository, for the generator's
// manifest of inputs.
const HeaderPath = "runtime/symm/kernels/collgen_symm.cuh"

// SymmHeader is collgen_symm.cuh.
//
//go:embed collgen_symm.cuh
var SymmHeader string
