package proof

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/generated/collectives"
	"github.com/collgen/collgen/runtime/comm"
	"github.com/collgen/collgen/runtime/cuda"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestMultiHostGPU proves the multi-host path on one machine with two
// GPUs: two "hosts" of one GPU each (Config.HostID differs, so the group
// runs the hierarchical collectives: copies within a host, NCCL across),
// then one host of two GPUs (the same id: the single-host generated
// kernels, exactly as without host ids). Every collective, f32 and bf16,
// in and out of place, automatic, hierarchical and plain NCCL.
func TestMultiHostGPU(t *testing.T) {
	gpus(t)
	for _, c := range []struct {
		name  string
		hosts []string
		algs  []coll.Algorithm
	}{
		{"two-hosts", []string{"hostA", "hostB"}, []coll.Algorithm{coll.Auto, coll.Hierarchical, coll.NCCL}},
		{"one-host", []string{"hostA", "hostA"}, []coll.Algorithm{coll.Auto}},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := rendezvous.NewMemStore()
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cfg := comm.Config{Library: collectives.Library, Rank: r, WorldSize: 2, Device: r, Store: store,
						Group: "multihost-" + c.name, HostID: c.hosts[r], StagingBytes: stagingBytes}
					errs[r] = multiHostRank(cfg, c.algs)
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMultiHostProcess is TestMultiHostGPU's two-host case with process
// ranks, one GPU each, started by
// `collgen run -n 2 -- proof.test -test.run TestMultiHostProcess`; each
// rank names its own host (COLLGEN_HOST_ID would make all ranks of a
// launcher one host).
func TestMultiHostProcess(t *testing.T) {
	if os.Getenv(rendezvous.EnvRank) == "" {
		t.Skip("run through collgen run (tests/proof/run.sh)")
	}
	gpus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, store, err := rendezvous.FromEnv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	cfg := comm.Config{Library: collectives.Library, Rank: env.Rank, WorldSize: env.WorldSize, Device: env.LocalRank, Store: store,
		Group: "multihost-process", HostID: fmt.Sprintf("host%d", env.Rank), StagingBytes: stagingBytes}
	if err := multiHostRank(cfg, []coll.Algorithm{coll.Auto, coll.Hierarchical, coll.NCCL}); err != nil {
		t.Fatal(err)
	}
}

// multiHostRank forms cfg's communicator, checks which path automatic
// selection takes, runs every collective with each algorithm and checks
// the output against the host reference computed from every rank's input.
func multiHostRank(cfg comm.Config, algs []coll.Algorithm) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cm, err := comm.New(ctx, cfg)
	if err != nil {
		return fmt.Errorf("rank %d: New: %w", cfg.Rank, err)
	}
	defer func() { err = errors.Join(err, cm.Close()) }()
	multi := len(algs) > 1
	alg, err := cm.Choose(coll.AllReduce, 4096, coll.F32, coll.Sum)
	if err != nil {
		return err
	}
	if (alg == coll.Hierarchical) != multi {
		return fmt.Errorf("rank %d: automatic selection picked %s for 4 KiB (spanning hosts: %v)", cfg.Rank, alg, multi)
	}
	w, dev := cfg.WorldSize, cm.Device()
	for _, alg := range algs {
		for _, collective := range []coll.Collective{coll.AllReduce, coll.ReduceScatter, coll.AllGather} {
			for _, dt := range []coll.DType{coll.F32, coll.BF16} {
				for _, n := range counts(collective, w, false) {
					for _, inPlace := range []bool{false, true} {
						inN, outN := n, n
						switch collective {
						case coll.ReduceScatter:
							inN = w * n
						case coll.AllGather:
							outN = w * n
						}
						ins := make([][]byte, w)
						for r := range ins {
							ins[r] = input(dt, inN, n, r)
						}
						size := dt.Size()
						bufBytes := max(inN, outN) * size
						buf, err := dev.Alloc(bufBytes)
						if err != nil {
							return err
						}
						in, out := buf, buf
						inOff := 0
						if !inPlace {
							if out, err = dev.Alloc(outN * size); err != nil {
								dev.Free(buf)
								return err
							}
						} else {
							switch collective {
							case coll.ReduceScatter:
								out = buf + cuda.DevicePtr(cfg.Rank*n*size)
							case coll.AllGather:
								inOff = cfg.Rank * n * size
								in = buf + cuda.DevicePtr(inOff)
							}
						}
						err = dev.CopyHtoD(in, ins[cfg.Rank])
						o := comm.Options{Algorithm: alg}
						if err == nil {
							switch collective {
							case coll.AllReduce:
								err = cm.AllReduce(comm.DeviceBuffer(in), comm.DeviceBuffer(out), n, dt, coll.Sum, o)
							case coll.ReduceScatter:
								err = cm.ReduceScatter(comm.DeviceBuffer(in), comm.DeviceBuffer(out), n, dt, coll.Sum, o)
							default:
								err = cm.AllGather(comm.DeviceBuffer(in), comm.DeviceBuffer(out), n, dt, o)
							}
						}
						got := make([]byte, outN*size)
						if err == nil {
							err = dev.CopyDtoH(got, out)
						}
						if !inPlace {
							dev.Free(out)
						}
						dev.Free(buf)
						what := fmt.Sprintf("rank %d: %s %s of %d (%s, in place %v)", cfg.Rank, collective, dt, n, alg, inPlace)
						if err != nil {
							return fmt.Errorf("%s: %w", what, err)
						}
						op := coll.Sum
						if collective == coll.AllGather {
							op = ""
						}
						c := collectives.Combination{Collective: collective, DType: dt, Op: op, World: w}
						if err := expect(c, cfg.Rank, w, n, ins, got); err != nil {
							return fmt.Errorf("%s: %w", what, err)
						}
					}
				}
			}
		}
	}
	return nil
}
