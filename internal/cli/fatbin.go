package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func init() { register("fatbin", newCmdFatbin) }

// EnvNVCC names the nvcc `collgen fatbin` runs when --nvcc is not given.
const EnvNVCC = "NVCC"

func newCmdFatbin(io *IO) *cobra.Command {
	var dir, out, archs, only, nvcc string
	cmd := &cobra.Command{
		Use:   "fatbin",
		Short: "Compile the generated kernels into one fatbin with nvcc, so nothing compiles at run time",
		Long: `Fatbin compiles every generated kernel in --dir (the cuda/ directory that
collgen generate wrote) as one translation unit with nvcc: a cubin for each
architecture in --arch, plus the newest one's PTX, which the driver compiles
for newer GPUs. The architectures compile in parallel.

A communicator given the fatbin (comm.Config.FatbinPath, $COLLGEN_FATBIN, or
its bytes in comm.Config.Fatbin, e.g. from //go:embed) loads every kernel
from it and never runs NVRTC; a fatbin without code for the GPU fails
comm.New with the architectures it holds. Without one, comm.New compiles
the kernels with NVRTC (see docs/cold-start.md).`,
		Example: `  collgen fatbin --arch sm_90 --dir internal/gen/cuda --out collgen.fatbin
  collgen fatbin --arch sm_90,sm_100 --only '*_w8'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			gencode, err := gencodeFlags(archs)
			if err != nil {
				return usageError(err)
			}
			if _, err := filepath.Match(only, ""); err != nil {
				return usageError(fmt.Errorf("fatbin: --only %q: %w", only, err))
			}
			kernels, err := filepath.Glob(filepath.Join(dir, only+".cu"))
			if err != nil || len(kernels) == 0 {
				return fmt.Errorf("fatbin: no kernel programs match %s (--dir is the cuda/ directory collgen generate wrote)", filepath.Join(dir, only+".cu"))
			}
			if nvcc == "" {
				nvcc = os.Getenv(EnvNVCC)
			}
			if nvcc == "" {
				nvcc = "nvcc"
			}
			path, err := exec.LookPath(nvcc)
			if err != nil {
				return fmt.Errorf("fatbin: nvcc not found (%v): install the CUDA toolkit, or name it with --nvcc or $%s", err, EnvNVCC)
			}
			tmp, err := os.MkdirTemp("", "collgen-fatbin-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			var all strings.Builder
			for _, k := range kernels {
				abs, err := filepath.Abs(k)
				if err != nil {
					return err
				}
				fmt.Fprintf(&all, "#include %s\n", strconv.Quote(abs))
			}
			unit := filepath.Join(tmp, "all.cu")
			if err := os.WriteFile(unit, []byte(all.String()), 0o644); err != nil {
				return err
			}
			if d := filepath.Dir(out); d != "" {
				if err := os.MkdirAll(d, 0o755); err != nil {
					return err
				}
			}
			nargs := append([]string{"-std=c++17", "-I", dir, "-fatbin", "--threads", "0"}, gencode...)
			nargs = append(nargs, "-o", out, unit)
			run := exec.CommandContext(cmd.Context(), path, nargs...)
			run.Stdout, run.Stderr = io.Err, io.Err
			t0 := time.Now()
			if err := run.Run(); err != nil {
				return fmt.Errorf("fatbin: %s %s: %w", nvcc, strings.Join(nargs, " "), err)
			}
			fmt.Fprintf(io.Out, "wrote %s: %d programs for %s in %v\n", out, len(kernels), archs, time.Since(t0).Round(time.Second))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "generated/cuda", "the generated cuda/ directory (collgen generate's --out plus /cuda)")
	f.StringVar(&out, "out", "collgen.fatbin", "the fatbin to write")
	f.StringVar(&archs, "arch", "sm_90", "architectures to compile for, comma or space separated (sm_80,sm_90,sm_100,...)")
	f.StringVar(&only, "only", "*", "a glob over program names (the .cu files' stems, e.g. '*_w2'): build only those (then use comm.Config.LazyKernels)")
	f.StringVar(&nvcc, "nvcc", "", "the nvcc to run (default $NVCC, else nvcc on PATH)")
	return cmd
}

// archRE is one architecture: sm_ and the compute capability, with an
// optional feature suffix (sm_90a).
var archRE = regexp.MustCompile(`^sm_([0-9]{2,3})([a-z]?)$`)

// gencodeFlags turns "sm_80,sm_90" into nvcc's -gencode flags: a cubin for
// each, and PTX for the newest, which the driver compiles for newer GPUs.
// The PTX is of the plain compute_NN: that of a suffixed target
// (compute_90a, compute_100f) runs on that architecture or family only.
func gencodeFlags(archs string) ([]string, error) {
	var flags []string
	newest, newestN := "", -1
	for _, a := range strings.FieldsFunc(archs, func(r rune) bool { return r == ',' || r == ' ' }) {
		m := archRE.FindStringSubmatch(a)
		if m == nil {
			return nil, fmt.Errorf("fatbin: --arch: %q is not an architecture such as sm_90", a)
		}
		cc := m[1] + m[2]
		flags = append(flags, "-gencode", "arch=compute_"+cc+",code=sm_"+cc)
		if n, _ := strconv.Atoi(m[1]); n > newestN {
			newest, newestN = m[1], n
		}
	}
	if newestN < 0 {
		return nil, fmt.Errorf("fatbin: --arch names no architecture")
	}
	return append(flags, "-gencode", "arch=compute_"+newest+",code=compute_"+newest), nil
}
