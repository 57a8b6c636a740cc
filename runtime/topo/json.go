package topo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MarshalText writes the bus id as String does, so a Machine's JSON reads
// like nvidia-smi's output.
func (b BusID) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText parses a bus id with ParseBusID.
func (b *BusID) UnmarshalText(t []byte) error {
	v, err := ParseBusID(string(t))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// unmarshalEnum parses an enum's text form (its String) by searching the
// values 0..n-1.
func unmarshalEnum[T interface {
	~int
	String() string
}](t []byte, n int, what string) (T, error) {
	for v := 0; v < n; v++ {
		if T(v).String() == string(t) {
			return T(v), nil
		}
	}
	return 0, fmt.Errorf("topo: unknown %s %q", what, t)
}

// MarshalText writes the kind's name ("gpu", "nvswitch", ...).
func (k RemoteKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (k *RemoteKind) UnmarshalText(t []byte) (err error) {
	*k, err = unmarshalEnum[RemoteKind](t, int(RemoteCPU)+1, "NVLink far end")
	return err
}

// MarshalText writes nvidia-smi's abbreviation ("PIX", "SYS", ...).
func (l Level) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (l *Level) UnmarshalText(t []byte) (err error) {
	*l, err = unmarshalEnum[Level](t, int(LevelSys)+1, "PCIe level")
	return err
}

// MarshalText writes nvidia-smi's abbreviation ("OK", "TNS", ...).
func (p P2P) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (p *P2P) UnmarshalText(t []byte) (err error) {
	*p, err = unmarshalEnum[P2P](t, int(P2PNotSupported)+1, "P2P status")
	return err
}

// WriteJSON writes the machine as indented JSON (`collgen topo --json`), to
// be read back with ReadJSON: a real machine saved this way becomes a test
// fixture anywhere.
func (m *Machine) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(m)
}

// ReadJSON reads a machine WriteJSON wrote, checking that its pair matrix
// matches its GPU count and that no two GPUs share a bus id.
func ReadJSON(r io.Reader) (*Machine, error) {
	var m Machine
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("topo: read machine: %w", err)
	}
	if len(m.GPUs) == 0 {
		return nil, errors.New("topo: read machine: it holds no GPUs (write one with collgen topo --json on a GPU host)")
	}
	for i := range m.GPUs {
		if j := m.GPU(m.GPUs[i].BusID); j != i {
			return nil, fmt.Errorf("topo: read machine: GPUs %d and %d both have bus id %s (a GPU without \"BusID\" has 0000:00:00.0); every GPU needs its own", j, i, m.GPUs[i].BusID)
		}
	}
	if len(m.Pairs) != len(m.GPUs) {
		return nil, fmt.Errorf("topo: read machine: %d GPUs but %d rows of pairs", len(m.GPUs), len(m.Pairs))
	}
	for i, row := range m.Pairs {
		if len(row) != len(m.GPUs) {
			return nil, fmt.Errorf("topo: read machine: row %d of pairs has %d entries, want %d", i, len(row), len(m.GPUs))
		}
	}
	return &m, nil
}
